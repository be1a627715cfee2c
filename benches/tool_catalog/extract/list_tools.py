#!/usr/bin/env python3
"""Start an MCP stdio server, do the handshake, page through tools/list, print JSON."""
import json, subprocess, sys, os, time, threading, select

def main():
    out = sys.argv[1]
    cmd = sys.argv[2:]
    env = dict(os.environ)
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(out + ".stderr", "wb"), env=env, start_new_session=True)
    buf = b""
    def send(msg):
        p.stdin.write((json.dumps(msg) + "\n").encode()); p.stdin.flush()
    def recv(want_id, timeout=60):
        nonlocal buf
        deadline = time.time() + timeout
        while time.time() < deadline:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line: continue
                try: m = json.loads(line)
                except Exception: 
                    sys.stderr.write("non-json: %r\n" % line[:200]); continue
                if m.get("id") == want_id and ("result" in m or "error" in m):
                    return m
                if "method" in m and "id" in m:
                    # server->client request: answer with empty result / error
                    send({"jsonrpc":"2.0","id":m["id"],"result":{}} if m["method"]=="ping" else {"jsonrpc":"2.0","id":m["id"],"error":{"code":-32601,"message":"not supported"}})
            r,_,_ = select.select([p.stdout],[],[],0.5)
            if r:
                chunk = os.read(p.stdout.fileno(), 1<<20)
                if not chunk:
                    raise SystemExit("server closed stdout")
                buf += chunk
        raise SystemExit("timeout waiting for id %s" % want_id)
    try:
        send({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"catalog-builder","version":"0.1"}}})
        init = recv(1)
        send({"jsonrpc":"2.0","method":"notifications/initialized"})
        time.sleep(float(os.environ.get("LT_SLEEP","0.5")))
        tools = []; cursor = None; i = 2
        while True:
            params = {} if cursor is None else {"cursor": cursor}
            send({"jsonrpc":"2.0","id":i,"method":"tools/list","params":params})
            r = recv(i)
            if "error" in r: raise SystemExit("tools/list error: %s" % r["error"])
            tools += r["result"].get("tools", [])
            cursor = r["result"].get("nextCursor")
            i += 1
            if not cursor: break
        json.dump({"serverInfo": init.get("result",{}).get("serverInfo"), "protocolVersion": init.get("result",{}).get("protocolVersion"), "tools": tools}, open(out,"w"), indent=1)
        print("%s: %d tools (%s)" % (out, len(tools), init.get("result",{}).get("serverInfo")))
    finally:
        try:
            p.stdin.close()
        except Exception: pass
        try: p.wait(3)
        except Exception:
            os.killpg(p.pid, 15)
            try: p.wait(3)
            except Exception: os.killpg(p.pid, 9)
main()
