//! The built `mcp-harness` binary: `tools`, `call`, `status` and `demo` against the demo
//! servers over stdio and HTTP in both eras, config files, and exit codes.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use support::*;

fn run(args: &[&str]) -> Output {
    Command::new(harness_exe())
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run mcp-harness")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn demo_cmd(args: &str) -> String {
    format!("{} demo-server {args}", harness_exe())
}

/// Runs the program with its stdout on `file` (open at `path`), expecting success; what
/// the file then holds.
fn run_into(args: &[&str], file: std::fs::File, path: &std::path::Path) -> String {
    let status = Command::new(harness_exe())
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(file)
        .status()
        .expect("run");
    let written = std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{written}");
    written
}

/// A config of one demo server `s`, everything granted, with `audit` (TOML lines) as
/// its `[audit]` table.
fn audit_config(name: &str, audit: &str) -> std::path::PathBuf {
    write(
        name,
        &format!(
            "[[servers]]\nid = \"s\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"s\"] }}\n[permissions.local]\n\"*\" = [\"*\"]\n[audit]\n{audit}",
            harness_exe(),
        ),
    )
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, text).expect("write");
    path
}

// A variable often holds a secret: an error about the value it put in quotes the
// variable as written, in the harness's own tables and in those read later (the
// gateway's, the exporters'). Before, serde's type errors quoted the secret itself.
#[test]
fn a_config_error_quotes_the_variable_not_the_secret_it_holds() {
    let secret = "s3cr3t-Token-Value";
    let server = format!(
        "[[servers]]\nid = \"alpha\"\ntransport = {{ type = \"stdio\", command = {:?} }}\n",
        harness_exe()
    );
    // The table, the command that reads it, the field named, and whether the error
    // quotes a value (a duration's does not, not even as written).
    let cases = [
        (
            "round_cap = \"${MCP_HARNESS_SECRET}\"\n",
            "tools",
            "round_cap",
            true,
        ),
        (
            "call_timeout = \"${MCP_HARNESS_SECRET}\"\n",
            "tools",
            "call_timeout",
            false,
        ),
        (
            "[gateway]\nmax_streams = \"${MCP_HARNESS_SECRET}\"\n",
            "serve",
            "gateway.max_streams",
            true,
        ),
        (
            "[telemetry]\ntraces = \"${env:MCP_HARNESS_SECRET}\"\n",
            "tools",
            "telemetry.traces",
            true,
        ),
    ];
    for (i, (table, command, field, quoted)) in cases.into_iter().enumerate() {
        let (top, rest) = match table.starts_with('[') {
            true => (String::new(), table.to_string()),
            false => (table.to_string(), String::new()),
        };
        let path = write(&format!("secret{i}.toml"), &format!("{top}{server}{rest}"));
        let p = path.to_string_lossy().to_string();
        let mut args = vec![command, "--config", &p];
        if command == "serve" {
            args.extend(["--listen", "127.0.0.1:0", "--dev-keys"]);
        }
        let o = Command::new(harness_exe())
            .args(&args)
            .env("MCP_HARNESS_SECRET", secret)
            .env("RUST_LOG", "error")
            .output()
            .expect("run");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{table}: {err}");
        assert!(!err.contains(secret), "{table}: {err}");
        assert!(err.contains(field), "{table}: {err}");
        assert_eq!(
            err.contains("MCP_HARNESS_SECRET}"),
            quoted,
            "{table}: {err}"
        );
    }
    // An exporter's own error about an endpoint a variable put in (read before the
    // command runs, which then finds no server).
    let path = write(
        "secret-endpoint.toml",
        "[telemetry]\nendpoint = \"${MCP_HARNESS_SECRET}\"\ntraces = true\n",
    );
    let o = Command::new(harness_exe())
        .args(["tools", "--config", &path.to_string_lossy()])
        .env("MCP_HARNESS_SECRET", format!("http://user:{secret}@[::1"))
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert!(err.contains("not exported"), "{err}");
    assert!(!err.contains(secret), "{err}");
    // A server id a variable put in, named by the error as the server: redacted too.
    let path = write(
        "secret-id.toml",
        &format!(
            "[[servers]]\nid = \"${{MCP_HARNESS_SECRET}}\"\ntransport = {{ type = \"stdio\", command = {:?} }}\n",
            harness_exe()
        ),
    );
    let o = Command::new(harness_exe())
        .args(["tools", "--config", &path.to_string_lossy()])
        .env("MCP_HARNESS_SECRET", format!("sk-live/{secret}"))
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains(secret), "{err}");
    assert!(err.contains("MCP_HARNESS_SECRET}"), "{err}");
    // Credentials a variable put where a URL's scheme would be (`user:password@host`
    // parses with the user as its scheme): the scheme is not quoted.
    let path = write(
        "secret-url.toml",
        "[[servers]]\nid = \"r\"\ntransport = { type = \"http\", url = \"${MCP_HARNESS_SECRET}\" }\n",
    );
    let o = Command::new(harness_exe())
        .args(["tools", "--config", &path.to_string_lossy()])
        .env("MCP_HARNESS_SECRET", format!("svc-{secret}:pw@h"))
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("http or https"), "{err}");
    assert!(!err.contains(secret), "{err}");
    // A variable set, but not to UTF-8 text, is said so: not read as unset, its
    // default taken in silence.
    use std::os::unix::ffi::OsStringExt;
    let path = write(
        "not-text.toml",
        "[[servers]]\nid = \"s\"\ntransport = { type = \"stdio\", command = \"${MCP_HARNESS_NOT_TEXT:-cat}\" }\n",
    );
    let o = Command::new(harness_exe())
        .args(["tools", "--config", &path.to_string_lossy()])
        .env(
            "MCP_HARNESS_NOT_TEXT",
            std::ffi::OsString::from_vec(vec![0xff, b'x']),
        )
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("MCP_HARNESS_NOT_TEXT is set but is not UTF-8"),
        "{err}"
    );
}

// A key the file names is quoted on the error's one line: a newline in it cannot
// forge a line of the program's own.
#[test]
fn a_config_error_quoting_a_key_stays_on_one_line() {
    let path = write(
        "newline-key.toml",
        "\"x\\nmcp-harness: all servers ready\" = 1\n",
    );
    let o = run(&["tools", "--config", &path.to_string_lossy()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("all servers ready"),
        "the key is quoted: {err}"
    );
    assert!(
        !err.lines()
            .any(|l| l.starts_with("mcp-harness: all servers ready")),
        "{err}"
    );
}

/// A FIFO in a fresh directory `name` that one thread writes an `mcpServers` config
/// to, once, when it is opened for reading.
fn config_in_a_fifo(
    name: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    std::thread::JoinHandle<std::io::Result<()>>,
) {
    let dir = scratch_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("servers.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let text = serde_json::json!({"mcpServers": {"alpha": {
        "command": harness_exe(), "args": ["demo-server", "alpha"]}}})
    .to_string();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(&fifo, text))
    };
    (dir, fifo, writer)
}

// `serve` on such a config does not read it again: its reload reads a regular file
// only. Before, the reload's watcher waited in a read for a writer, holding a runtime
// thread for good: with one thread, serve answered not even a SIGTERM.
#[test]
fn serve_on_a_config_that_can_be_read_once_does_not_wait_to_read_it_again() {
    let (dir, fifo, writer) = config_in_a_fifo("fifo-serve");
    let child = Command::new(harness_exe())
        .args(["serve", "--config", &fifo.to_string_lossy()])
        .args(["--listen", "127.0.0.1:0", "--dev-keys"])
        .env("RUST_LOG", "error")
        .env("TOKIO_WORKER_THREADS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    writer.join().expect("writer").expect("written");
    std::thread::sleep(Duration::from_secs(2));
    for signal in ["-HUP", "-TERM"] {
        send_signal(signal, &child.id().to_string());
        std::thread::sleep(Duration::from_millis(300));
    }
    let pid = child.id();
    let waited = std::thread::spawn(move || child.wait_with_output());
    let began = std::time::Instant::now();
    while !waited.is_finished() {
        if began.elapsed() > Duration::from_secs(20) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("serve did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waited.join().expect("join").expect("output");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// A config that can be read once (a FIFO, `--config <(…)`) is read once. Before, the
// read for the exporters took it, and the command's own read then waited for a writer
// for good.
#[test]
fn a_config_that_can_be_read_once_is_read_once() {
    let (dir, fifo, writer) = config_in_a_fifo("fifo-config");
    let mut child = Command::new(harness_exe())
        .args(["tools", "--config", &fifo.to_string_lossy()])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let began = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if began.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the command waited to read its config again");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().expect("output");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("echo"), "{}", stdout(&o));
    writer.join().expect("writer").expect("written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tools_lists_stdio_servers_of_both_eras_as_text_and_json() {
    let (modern, legacy) = (demo_cmd("alpha"), demo_cmd("beta --era legacy"));
    let o = run(&["tools", "--stdio", &modern, "--stdio", &legacy]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("stdio1__echo") && out.contains("stdio2__echo"),
        "{out}"
    );
    assert!(out.contains("modern") && out.contains("legacy"), "{out}");
    let o = run(&["tools", "--stdio", &modern, "--json"]);
    let tools: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    let add = tools
        .iter()
        .find(|t| t["qualified"] == "stdio1__add")
        .expect("add");
    assert_eq!(add["name"], "add");
    assert_eq!(add["server"], "stdio1");
    assert_eq!(
        add["inputSchema"]["required"],
        serde_json::json!(["a", "b"])
    );
}

#[tokio::test]
async fn call_and_status_work_over_http_in_both_eras() {
    let modern = HttpServer::demo(&["gamma"]).await;
    let legacy = HttpServer::demo(&["delta", "--era", "legacy"]).await;
    let (m, l) = (modern.url.clone(), legacy.url.clone());
    let out = tokio::task::spawn_blocking(move || {
        let call = run(&[
            "call",
            "--http",
            &m,
            "--http",
            &l,
            "http2__echo",
            r#"{"text":"legacy over http"}"#,
        ]);
        let status = run(&["status", "--http", &m, "--http", &l, "--json"]);
        (call, status)
    })
    .await
    .expect("join");
    assert!(out.0.status.success(), "{}", stderr(&out.0));
    assert_eq!(stdout(&out.0).trim(), "legacy over http");
    let status: Vec<Value> = serde_json::from_str(&stdout(&out.1)).expect("json");
    assert_eq!(status.len(), 2);
    assert!(status.iter().all(|s| s["state"] == "ready"));
    assert_eq!(status[0]["era"], "modern");
    assert_eq!(status[1]["era"], "legacy");
}

#[test]
fn call_answers_elicitation_from_answers_and_declines_without_them() {
    let s = demo_cmd("alpha");
    let o = run(&[
        "call",
        "--stdio",
        &s,
        "confirm",
        r#"{"message":"go?"}"#,
        "--answers",
        "{}",
    ]);
    assert_eq!(
        stdout(&o).trim(),
        "approved: false",
        "defaults: {}",
        stderr(&o)
    );
    let o = run(&[
        "call",
        "--stdio",
        &s,
        "confirm",
        "--answers",
        r#"{"approved":true}"#,
    ]);
    assert_eq!(stdout(&o).trim(), "approved: true", "{}", stderr(&o));
    let o = run(&[
        "call",
        "--stdio",
        &s,
        "rounds",
        r#"{"n":3}"#,
        "--answers",
        r#"{"answer":"x"}"#,
    ]);
    assert_eq!(stdout(&o).trim(), "answers: x,x,x", "{}", stderr(&o));
    let legacy = demo_cmd("beta --era legacy");
    let o = run(&[
        "call",
        "--stdio",
        &legacy,
        "confirm",
        "--answers",
        r#"{"approved":true}"#,
        "--json",
    ]);
    let result: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(result["content"][0]["text"], "approved: true");
    // No terminal, no answers: declined, the call ends with exit 1 and a hint.
    let o = run(&["call", "--stdio", &s, "confirm"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("declined"), "{}", stderr(&o));
}

// A form without fields (a confirmation: "Delete everything?") is not accepted on
// answers meant for fields: only `"!confirm": "accept"` consents, and the question is
// shown on stderr either way. Before, any `--answers` accepted it unseen.
#[test]
fn a_confirmation_is_accepted_from_answers_only_with_its_own_consent() {
    let s = demo_cmd("alpha");
    let empty = r#"{"n":1,"mode":"empty"}"#;
    let o = run(&[
        "call",
        "--stdio",
        &s,
        "many_inputs",
        empty,
        "--answers",
        r#"{"branch":"main"}"#,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("asks you to confirm"), "{}", stderr(&o));
    assert!(stderr(&o).contains("!confirm"), "{}", stderr(&o));
    let o = run(&[
        "call",
        "--stdio",
        &s,
        "many_inputs",
        empty,
        "--answers",
        r#"{"!confirm":"accept"}"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("got 1 answers"), "{}", stdout(&o));
    assert!(stderr(&o).contains("asks you to confirm"), "{}", stderr(&o));
}

// The demo servers' tools show the environment and start processes: they listen on
// loopback only, and refuse any other address rather than serve it.
#[test]
fn the_demo_servers_refuse_to_listen_off_loopback() {
    for args in [
        &["demo-server", "x", "--http", "0.0.0.0:0"][..],
        &["demo-auth-server", "--secret", "s", "--http", "0.0.0.0:0"][..],
    ] {
        let out = run(args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(
            stderr(&out).contains("loopback only"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("listening"), "{args:?}");
    }
}

#[test]
fn exit_codes_say_what_happened() {
    let s = demo_cmd("alpha");
    assert_eq!(
        run(&["call", "--stdio", &s, "echo", r#"{"text":"hi"}"#])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        run(&["call", "--stdio", &s, "add", r#"{"a":"x"}"#])
            .status
            .code(),
        Some(1),
        "isError"
    );
    let o = run(&["call", "--stdio", &s, "no_such_tool"]);
    assert_eq!(o.status.code(), Some(3), "no server can serve it");
    assert!(stderr(&o).lines().count() <= 2, "{}", stderr(&o));
    assert_eq!(
        run(&["call", "--stdio", &s, "echo", "not json"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(run(&["tools"]).status.code(), Some(2), "no servers");
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
}

#[test]
fn audit_records_that_could_not_be_written_make_the_cli_say_so_and_exit_4() {
    // An audit file on a full disk: the call is admitted (nothing has failed yet), and
    // its records cannot be written by the time the harness stops.
    let dir = scratch_dir().join("audit-full-cli");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let audit = dir.join("audit.jsonl");
    std::os::unix::fs::symlink("/dev/full", &audit).expect("symlink");
    let config = audit_config(
        "audit-full-cli.toml",
        &format!("path = {:?}\n", audit.display().to_string()),
    );
    let config = config.display().to_string();
    let o = run(&["call", "--config", &config, "s__echo", r#"{"text":"hi"}"#]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("audit record(s) could not be written"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// `/dev/stdout` redirected to a file (`> out.log`, no O_APPEND): the records and what
// the call prints share one offset, so neither overwrites the other, and on a socket
// (systemd's journal), which cannot be opened by name, the trail is written too.
#[test]
fn an_audit_trail_on_stdout_shares_it_with_what_the_call_prints() {
    let config = audit_config(
        "audit-stdout-shared-cli.toml",
        "path = \"/dev/stdout\"\nflush_every = \"10ms\"\n",
    );
    let config = config.display().to_string();
    // Slower than the writer's timer: `started` is written before the result is printed.
    let args = [
        "call",
        "--config",
        &config,
        "s__echo",
        r#"{"text":"hi","ms":300}"#,
    ];
    let check = |written: &str| {
        let mut events = Vec::new();
        for line in written.lines().filter(|l| *l != "hi") {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?} in {written}"));
            events.push(v["event"].as_str().unwrap_or_default().to_string());
        }
        assert_eq!(events, ["started", "finished"], "{written}");
        assert!(written.lines().any(|l| l == "hi"), "{written}");
    };
    let out = scratch_dir().join("audit-stdout-shared.out");
    let file = std::fs::File::create(&out).expect("out");
    let written = run_into(&args, file, &out);
    check(&written);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let mut child = Command::new(harness_exe())
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(std::os::fd::OwnedFd::from(theirs))
        .spawn()
        .expect("run");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &ours, &mut text).map(|_| text)
    });
    let status = child.wait().expect("wait");
    let written = reader.join().expect("reader").expect("read");
    assert_eq!(status.code(), Some(0), "{written}");
    check(&written);
    let _ = std::fs::remove_file(&out);
    // Where stdout carries a client's messages, records there are refused before start.
    let o = run(&["serve", "--stdio", "--dev-keys", "--config", &config]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("this process's stdout, which a bare --stdio"),
        "{}",
        stderr(&o)
    );
}

// The audit trail written to `/dev/stdout`, redirected to a file others may write (a
// umask of 002, or a file systemd made as root): this process's own stdout is where it
// was told to write, not a file someone planted.
#[test]
fn an_audit_trail_on_stdout_redirected_to_a_shared_file_is_written() {
    use std::os::unix::fs::PermissionsExt;
    let config = audit_config("audit-stdout-cli.toml", "path = \"/dev/stdout\"\n");
    let out = scratch_dir().join("audit-stdout-cli.out");
    let file = std::fs::File::create(&out).expect("out");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let config = config.display().to_string();
    let args = ["call", "--config", &config, "s__echo", r#"{"text":"hi"}"#];
    let written = run_into(&args, file, &out);
    assert!(written.contains("\"finished\""), "{written}");
    // Elsewhere, a file others may write is refused (the call is then refused too).
    let audit = scratch_dir().join("audit-shared.jsonl");
    std::fs::write(&audit, "").expect("audit");
    std::fs::set_permissions(&audit, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let shared = audit_config(
        "audit-shared-cli.toml",
        &format!("path = {:?}\n", audit.display().to_string()),
    );
    let o = run(&[
        "call",
        "--config",
        &shared.display().to_string(),
        "s__echo",
        r#"{"text":"hi"}"#,
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&audit).unwrap_or_default(), "");
    // A directory every user may write to, where anyone could remove the file, is used
    // with a warning (a Kubernetes emptyDir is 0777); made sticky (as `/tmp` is), with
    // none.
    let dir = scratch_dir().join("audit-open-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let audit = dir.join("audit.jsonl");
    let open = audit_config(
        "audit-open-dir-cli.toml",
        &format!("path = {:?}\n", audit.display().to_string()),
    );
    let args = [
        "call",
        "--config",
        &open.display().to_string(),
        "s__echo",
        r#"{"text":"hi"}"#,
    ];
    let warned = || {
        let o = Command::new(harness_exe())
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run");
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stderr(&o).contains("not sticky")
    };
    assert!(warned());
    assert!(
        std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .contains("finished")
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    assert!(!warned());
    let _ = std::fs::remove_dir_all(&dir);
}

// Output to a reader that has gone (`| head`) ends the command as it would, its servers
// stopped: it panicked (exit 101) and left the graceful stop undone.
#[test]
fn a_closed_stdout_ends_the_command_without_a_panic() {
    use std::io::Read;
    let server = demo_cmd("s --extra-tools 3000");
    let mut child = Command::new(harness_exe())
        .args(["tools", "--stdio", &server])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = [0u8; 16];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut first)
        .expect("the listing starts");
    // The pipe's read end is gone (dropped above) before the listing is written.
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

// The same for stderr (`2>&1 | head`): a server that failed to start is reported there
// after the listing.
#[test]
fn a_closed_stderr_ends_the_command_without_a_panic() {
    let server = demo_cmd("s");
    let mut child = Command::new(harness_exe())
        .args([
            "tools",
            "--stdio",
            &server,
            "--stdio",
            "/nonexistent/mcp-server",
        ])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stderr.take());
    let status = child.wait().expect("wait");
    // 3: a server failed to start (named on stderr, which nobody reads); not 101.
    assert_eq!(status.code(), Some(3), "{status:?}");
}

// JSON arguments and answers are objects: `--answers false` matched no field and
// accepted every form with its defaults.
#[test]
fn arguments_and_answers_that_are_not_objects_are_usage_errors() {
    let server = demo_cmd("s");
    for args in [
        vec!["call", "--stdio", &server, "echo", "[1]"],
        vec!["call", "--stdio", &server, "echo", "null"],
        vec![
            "call",
            "--stdio",
            &server,
            "confirm",
            r#"{"message":"Delete everything?"}"#,
            "--answers",
            "false",
        ],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("must be a JSON object"),
            "{}",
            stderr(&o)
        );
    }
}

// A listener `serve` cannot open once its servers run stops them, and says so with a
// usage error, not after leaving them to the runtime's end.
#[test]
fn serve_on_a_port_in_use_stops_its_servers_and_says_why() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let mark = scratch_dir().join("serve-port-taken.mark");
    let server = demo_cmd(&format!("s --record {}", mark.display()));
    let o = run(&["serve", "--stdio", &server, "--listen", &addr, "--dev-keys"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot listen"), "{}", stderr(&o));
    let ours = processes_with(&mark.display().to_string());
    assert!(ours.is_empty(), "server processes left: {ours:?}");
    drop(taken);
}

#[tokio::test]
async fn an_mcp_servers_json_file_works_unchanged() {
    let http = HttpServer::demo(&["web"]).await;
    let json = serde_json::json!({
        "mcpServers": {
            "files": {"command": harness_exe(), "args": ["demo-server", "files"], "env": {"X": "1"}},
            "web": {"type": "http", "url": http.url},
            "old": {"command": harness_exe(), "args": ["demo-server", "old", "--era", "legacy"], "autoApprove": []}
        }
    });
    let path = write("mcp.json", &json.to_string());
    let p = path.to_string_lossy().to_string();
    let o = tokio::task::spawn_blocking(move || run(&["tools", "--config", &p]))
        .await
        .expect("join");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for name in ["files__echo", "web__echo", "old__echo"] {
        assert!(out.contains(name), "{name} in {out}");
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_toml_config_with_env_vars_grants_and_a_typo_is_an_error_naming_the_key() {
    let toml = r#"
agent = "planner"
round_cap = 5

[[servers]]
id = "alpha"
priority = 3
timeout = "20s"
trust_annotations = true
transport = { type = "stdio", command = "${MCP_HARNESS_TEST_BIN}", args = ["demo-server", "alpha"] }
restart = { policy = "transient", min_delay = "50ms" }

[permissions.planner]
alpha = ["echo"]
"#
    .to_string();
    let path = write("ok.toml", &toml);
    let p = path.to_string_lossy().to_string();
    let with_env = |args: &[&str]| {
        Command::new(harness_exe())
            .args(args)
            .env("MCP_HARNESS_TEST_BIN", harness_exe())
            .env("RUST_LOG", "error")
            .output()
            .expect("run")
    };
    let o = with_env(&["call", "--config", &p, "echo", r#"{"text":"from toml"}"#]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "from toml");
    let o = with_env(&["call", "--config", &p, "add", r#"{"a":1,"b":2}"#]);
    assert_eq!(o.status.code(), Some(3), "planner is not granted add");
    assert!(stderr(&o).contains("denied"), "{}", stderr(&o));
    let o = run(&["tools", "--config", &p]);
    assert_eq!(o.status.code(), Some(2), "unset variable");
    assert!(
        stderr(&o).contains("MCP_HARNESS_TEST_BIN"),
        "{}",
        stderr(&o)
    );

    let typo = write("typo.toml", &toml.replace("timeout =", "timout ="));
    let t = typo.to_string_lossy().to_string();
    let o = with_env(&["tools", "--config", &t]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("timout") && err.contains("typo.toml"), "{err}");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(typo);
}

#[test]
fn the_demo_runs_every_step_and_reads_cleanly() {
    let o = Command::new(harness_exe())
        .arg("demo")
        .env_remove("RUST_LOG")
        .output()
        .expect("run the demo");
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // No log lines in the middle of the walk-through, and no Rust Debug formatting.
    assert_eq!(stderr(&o), "", "the demo logs nothing unless asked");
    for debug in [
        "Some(",
        "None",
        "String(",
        "Ready",
        "Restarting",
        "Modern",
        "Legacy",
        "\\\"",
    ] {
        assert!(
            !out.contains(debug),
            "Debug formatting {debug:?} in:\n{out}"
        );
    }
    for needle in [
        "era=legacy",
        "from the cache",
        "served by alpha",
        "alpha__rounds (3 rounds) -> \"answers: yes,yes,yes\"",
        "beta__confirm (legacy) -> \"approved: true\"",
        "denied",
        "restarts=1",
        "all gone",
        "Done.",
    ] {
        assert!(out.contains(needle), "{needle:?} missing from:\n{out}");
    }
}

#[test]
fn the_example_config_in_the_repository_runs() {
    // The example's cache and audit paths are under /tmp; the test's copy keeps them in
    // its scratch directory instead.
    let dir = scratch_dir();
    let example = std::fs::read_to_string("examples/harness.toml").expect("example config");
    let text = example
        .replace(
            "/tmp/mcp-harness-cache",
            &dir.join("cache").to_string_lossy(),
        )
        .replace(
            "/tmp/mcp-harness-audit.jsonl",
            &dir.join("audit.jsonl").to_string_lossy(),
        );
    for path in ["/tmp/mcp-harness-cache", "/tmp/mcp-harness-audit.jsonl"] {
        assert!(
            example.contains(path),
            "the example's {path} moved: update this test"
        );
    }
    let config = write("example.toml", &text);
    let o = Command::new(harness_exe())
        .args(["status", "--config", &config.to_string_lossy()])
        .env("HOME", "/tmp")
        .env("RUST_LOG", "error")
        .output()
        .expect("run");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("alpha") && stdout(&o).contains("legacy"),
        "{}",
        stdout(&o)
    );
}

/// Sets SIGHUP's disposition in the child to `disposition` (as a terminal leaves it,
/// `SIG_DFL`, or `nohup`, `SIG_IGN`), whatever the tests run under.
fn sighup_at(cmd: &mut Command, disposition: libc::sighandler_t) {
    signals_at(cmd, &[libc::SIGHUP], disposition);
}

/// Sets the disposition of `signals` in the child to `disposition`.
fn signals_at(cmd: &mut Command, signals: &[libc::c_int], disposition: libc::sighandler_t) {
    use std::os::unix::process::CommandExt;
    let signals = signals.to_vec();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for &s in &signals {
                libc::signal(s, disposition);
            }
            Ok(())
        });
    }
}

/// `call --stdio` of a server recording to `record`, whose `hang` tool never answers,
/// SIGHUP at `disposition`, once the call has reached the server.
fn hanging_call(
    record: &std::path::PathBuf,
    disposition: libc::sighandler_t,
) -> std::process::Child {
    hanging_call_with(record, &[libc::SIGHUP], disposition)
}

/// [`hanging_call`] with `signals` at `disposition`.
fn hanging_call_with(
    record: &std::path::PathBuf,
    signals: &[libc::c_int],
    disposition: libc::sighandler_t,
) -> std::process::Child {
    let server = demo_cmd(&format!("alpha --record {}", record.display()));
    let mut cmd = Command::new(harness_exe());
    cmd.args(["call", "--stdio", &server, "hang"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    signals_at(&mut cmd, signals, disposition);
    let child = cmd.spawn().expect("spawn");
    let start = std::time::Instant::now();
    while !recorded(record)
        .iter()
        .any(|r| r["params"]["name"] == "hang")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the call never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}
#[test]
fn ctrl_c_stops_every_server_and_exits() {
    let pidfile = scratch_dir().join("ctrlc.jsonl");
    // Once the call reached the server, the program is interrupted.
    let child = hanging_call(&pidfile, libc::SIG_DFL);
    send_signal("-INT", &child.id().to_string());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The server was a child of the program, in its own process group; none is left.
    let ours = processes_with(&pidfile.display().to_string());
    assert!(ours.is_empty(), "server processes left: {ours:?}");
    let _ = std::fs::remove_file(pidfile);
}

// A start held up (here by its CA bundle, a FIFO no one writes, as a mount that hangs
// would) hears Ctrl-C: the program ends, its servers stopped. Before, every signal was
// swallowed until the start gave up, 30 s later, with another error.
#[test]
fn ctrl_c_during_a_start_held_up_ends_it() {
    let fifo = scratch_dir().join(format!("ca-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let marker = format!("held-up-{}", std::process::id());
    let child = Command::new(harness_exe())
        .args(["tools", "--stdio", &demo_cmd(&marker)])
        .args(["--http", "https://127.0.0.1:9/mcp"])
        .env("SSL_CERT_FILE", &fifo)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(1500));
    send_signal("-INT", &child.id().to_string());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    // Killed as the program went (their parent-death signal, or their group's kill).
    let gone = std::time::Instant::now();
    while !processes_with(&marker).is_empty() && gone.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_with(&marker);
    assert!(left.is_empty(), "server processes left: {left:?}");
    let _ = std::fs::remove_file(fifo);
}

// The harness killed outright runs none of its own stops; the kernel kills each
// server it forked (its parent-death signal), even one that ignores end of file on
// stdin and SIGTERM. Before, such a server ran on, reparented, for ever.
#[test]
fn a_server_that_ignores_stdin_dies_with_a_harness_killed_outright() {
    use std::os::unix::fs::PermissionsExt;
    let script = scratch_dir().join(format!("linger-{}.sh", std::process::id()));
    std::fs::write(
        &script,
        "#!/bin/sh\ntrap '' TERM HUP INT\nexec 0</dev/null\nwhile :; do sleep 1; done\n",
    )
    .expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let marker = script.display().to_string();
    let mut harness = Command::new(harness_exe())
        .args(["tools", "--stdio", &marker])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // The harness's own command line names the script too.
    let harness_pid = harness.id();
    let servers = || -> Vec<u32> {
        processes_with(&marker)
            .into_iter()
            .filter(|p| *p != harness_pid)
            .collect()
    };
    let start = std::time::Instant::now();
    while servers().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the server never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    harness.kill().expect("SIGKILL");
    harness.wait().expect("wait");
    let start = std::time::Instant::now();
    while !processes_with(&marker).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = processes_with(&marker);
    for pid in &left {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "server processes left: {left:?}");
}

// A signal while the servers are still starting stops them too, and the program ends
// with the signal's code: a stdio server is in a process group of its own, which the
// terminal's Ctrl-C never reaches. Before, the signal's default action ended the
// program at once and left such a server behind.
#[test]
fn a_signal_while_servers_start_stops_them_and_exits() {
    for (command, signal, code) in [
        ("call", "-INT", 130),
        ("tools", "-TERM", 143),
        // A terminal closed (or an SSH session dropped), and Ctrl-\.
        ("call", "-HUP", 129),
        ("tools", "-QUIT", 131),
        ("serve", "-TERM", 0),
    ] {
        let mark = scratch_dir().join(format!("starting-{command}{signal}.pid"));
        let _ = std::fs::remove_file(&mark);
        // A server that never answers: it stays `starting` for the whole --wait.
        let script = write(
            &format!("starting-{command}{signal}.sh"),
            &format!("echo $$ > {}\nexec sleep 120\n", mark.display()),
        );
        let server = format!("sh {}", script.display());
        let mut args = vec![command, "--stdio", &server, "--wait", "60s"];
        match command {
            "call" => args.push("x__y"),
            "serve" => args.extend(["--listen", "127.0.0.1:0", "--dev-keys"]),
            _ => {}
        }
        let mut cmd = Command::new(harness_exe());
        cmd.args(&args)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // As on a terminal: SIGHUP at its default even when the tests run under
        // `nohup` (the command leaves an ignored one alone).
        sighup_at(&mut cmd, libc::SIG_DFL);
        let child = cmd.spawn().expect("spawn");
        let start = std::time::Instant::now();
        let pid = loop {
            if let Some(pid) = std::fs::read_to_string(&mark)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                break pid;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{command}: no server"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(200));
        send_signal(signal, &child.id().to_string());
        let out = child.wait_with_output().expect("wait");
        assert_eq!(
            out.status.code(),
            Some(code),
            "{command} {signal}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !alive(pid),
            "{command} {signal}: the starting server {pid} was left"
        );
        let _ = std::fs::remove_file(mark);
    }
}

// A SIGHUP to `serve` while its servers start (before its config reload listens) is
// not heard: its default action ended the gateway at once, its starting stdio server
// left running.
#[test]
fn a_hangup_while_serve_starts_does_not_end_it() {
    let mark = scratch_dir().join("serve-hup.pid");
    let _ = std::fs::remove_file(&mark);
    let script = write(
        "serve-hup.sh",
        &format!("echo $$ > {}\nexec sleep 120\n", mark.display()),
    );
    let server = format!("sh {}", script.display());
    let mut cmd = Command::new(harness_exe());
    cmd.args(["serve", "--stdio", &server, "--wait", "60s"])
        .args(["--listen", "127.0.0.1:0", "--dev-keys"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    sighup_at(&mut cmd, libc::SIG_DFL);
    let mut child = cmd.spawn().expect("spawn");
    let start = std::time::Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&mark)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            break pid;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no server");
        std::thread::sleep(Duration::from_millis(20));
    };
    let me = child.id().to_string();
    let kill = |signal: &str| {
        send_signal(signal, &me);
    };
    kill("-HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "ended by the hangup"
    );
    kill("-TERM");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    assert!(!alive(pid), "the starting server {pid} was left");
    let _ = std::fs::remove_file(mark);
}

// A terminal that closes often sends SIGHUP twice (the kernel's hangup, the shell's to
// its jobs): the echo is one signal, and the servers are stopped, not killed as a
// second signal would have them.
#[test]
fn a_hangup_sent_twice_stops_the_servers_gracefully() {
    let pidfile = scratch_dir().join("hup-twice.jsonl");
    let mut child = hanging_call(&pidfile, libc::SIG_DFL);
    // Its stderr line by line, as it comes.
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let hang_up = || {
        // SAFETY: a signal to the child this test started (not yet reaped).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    hang_up();
    // The first was taken (the stop began): the echo follows at once, well within the
    // window, and is not merged with the first.
    let mut seen = Vec::new();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the stop begins");
        let began = line.contains("stopping servers");
        seen.push(line);
        if began {
            break;
        }
    }
    hang_up();
    let status = child.wait().expect("wait");
    seen.extend(lines.iter());
    let stderr = seen.join("\n");
    assert_eq!(status.code(), Some(129), "{stderr}");
    // The call in flight held the graceful stop (its grace) when the echo came.
    assert!(!stderr.contains("stopping at once"), "{stderr}");
    assert!(processes_with(&pidfile.display().to_string()).is_empty());
    let _ = std::fs::remove_file(pidfile);
}

// Under `nohup` (SIGHUP ignored) a command outlives its terminal: the hangup is left
// ignored, and the command goes on until another signal stops it.
#[test]
fn a_command_under_nohup_outlives_a_hangup() {
    let pidfile = scratch_dir().join("nohup.jsonl");
    let mut child = hanging_call(&pidfile, libc::SIG_IGN);
    let pid = child.id().to_string();
    let kill = |signal: &str| {
        send_signal(signal, &pid);
    };
    kill("-HUP");
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "ended by a hangup"
    );
    // Not stopping either (a graceful stop cancels the call in flight on its server).
    assert!(
        !recorded(&pidfile)
            .iter()
            .any(|r| r["notification"] == "notifications/cancelled"),
        "a stop began at the hangup"
    );
    kill("-TERM");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    assert!(processes_with(&pidfile.display().to_string()).is_empty());
    let _ = std::fs::remove_file(pidfile);
}

// Started as a shell starts a background job (SIGINT and SIGQUIT ignored), a command
// leaves them ignored: the terminal's Ctrl-C is for the job in front. SIGTERM stops it.
#[test]
fn a_background_job_leaves_ctrl_c_ignored() {
    let pidfile = scratch_dir().join("background.jsonl");
    let mut child = hanging_call_with(&pidfile, &[libc::SIGINT, libc::SIGQUIT], libc::SIG_IGN);
    let pid = child.id().to_string();
    send_signal("-INT", &pid);
    send_signal("-QUIT", &pid);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "ended by an ignored signal"
    );
    send_signal("-TERM", &pid);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(143));
    assert!(processes_with(&pidfile.display().to_string()).is_empty());
    let _ = std::fs::remove_file(pidfile);
}

// `--from` that is no http(s) URL is a usage error at once, not a request failing the
// same way every second.
#[test]
fn a_from_that_is_no_url_is_a_usage_error() {
    for args in [
        &["status", "--watch", "--from", "localhost:9090/metrics"][..],
        &["approvals", "--from", "ftp://x/", "--token", "t"][..],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--from"), "{}", stderr(&o));
    }
    // A token goes in the clear to no other machine (refused before anything is sent).
    let token = [("MCP_HARNESS_METRICS_TOKEN", "t")];
    for (args, env) in [
        (
            &[
                "approvals",
                "--from",
                "http://gw.example:9/",
                "--token",
                "t",
            ][..],
            &[][..],
        ),
        (
            &["status", "--watch", "--from", "http://gw.example:9/metrics"][..],
            &token[..],
        ),
    ] {
        let o = run_env(args, env);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("https"), "{}", stderr(&o));
    }
    // Flags for starting servers mean nothing with --from: refused, not ignored (a CA
    // the user expected trusted would not be).
    for flag in [
        &["--ca-file", "/tmp/ca.pem"][..],
        &["--tokens", "/tmp/t"],
        &["--wait", "5s"],
    ] {
        let mut args = vec!["status", "--watch", "--from", "http://127.0.0.1:9/metrics"];
        args.extend(flag);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag[0]), "{}", stderr(&o));
    }
}

// A config file others may write is read with a warning, once: said before the
// command's logging began, it was said to no one.
#[test]
fn a_config_file_anyone_may_write_is_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let text = format!("{}[permissions.local]\ns = [\"*\"]\n", toml_demo("s", ""));
    let path = config_file("anyone", "h.toml", &text);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let o = run_default_log(&["tools", "-c", &path.display().to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stderr(&o).matches("may be written by others").count();
    assert_eq!(said, 1, "{}", stderr(&o));
}

// A warning about what a config file holds is said once, though the file is read
// twice (once early, for its telemetry). Before, each came twice.
#[test]
fn a_config_files_warnings_are_said_once() {
    let text = format!(
        "{{\"mcpServers\": {{\"s\": {{\"command\": {:?}, \"args\": [\"demo-server\", \"s\"], \"foo\": 1}}}}}}",
        harness_exe()
    );
    let path = config_file("warned-once", "servers.json", &text);
    let o = run_default_log(&["tools", "-c", &path.display().to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stderr(&o)
        .matches("ignoring a key this program does not use")
        .count();
    assert_eq!(said, 1, "{}", stderr(&o));
}

// `--client-id`, `--issuer`, `--ca-file` apply to the command line's `--http` servers:
// given without one, they are a usage error, not dropped in silence (the config's
// server signing in some other way).
#[test]
fn flags_for_http_servers_without_one_are_a_usage_error() {
    let stdio = demo_cmd("s");
    for flag in [
        &["--client-id", "svc"][..],
        &["--issuer", "https://idp.example"][..],
        &["--ca-file", "/nonexistent.pem"][..],
    ] {
        let mut args = vec!["tools", "--stdio", &stdio];
        args.extend(flag);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{flag:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag[0]), "{}", stderr(&o));
    }
}

// A question goes to stderr: with stderr away from the terminal (`2>log`) nobody
// would see it, so none is asked and the input is declined at once rather than at
// the end of the time for input.
#[test]
fn no_question_is_asked_when_stderr_is_not_the_terminal() {
    let cmd = format!(
        "{} call --stdio '{}' many_inputs '{{\"n\":1}}' 2>/dev/null",
        harness_exe(),
        demo_cmd("s")
    );
    // The terminal's input left open: an asked question would wait for it.
    let (status, o) = on_a_terminal_left_open(&cmd);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "declined, not waiting: {}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains("Which?"), "{}", stdout(&o));
}

fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(harness_exe());
    c.args(args).env("RUST_LOG", "error");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run mcp-harness")
}

// Hardening item 12: stdio servers get a minimal environment unless told otherwise.
#[test]
fn item_12_stdio_servers_get_a_minimal_environment_unless_inherit_env() {
    let secret = [
        ("MCP_TEST_SECRET", "hunter2"),
        ("MCP_HARNESS_GATEWAY_KEYS", "k1:c2VjcmV0"),
        ("MCP_HARNESS_ADMIN_TOKEN", "admin"),
        ("MCP_HARNESS_METRICS_TOKEN", "metrics"),
    ];
    let o = run_env(
        &["call", "--stdio", &demo_cmd("s"), "env", "--json"],
        &secret,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let env: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let vars = &env["structuredContent"];
    assert!(vars.get("PATH").is_some(), "PATH is passed: {vars}");
    assert!(
        vars.get("MCP_TEST_SECRET").is_none(),
        "the harness's secrets stay out"
    );
    let toml = format!(
        "[[servers]]\nid = \"s\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"s\"], inherit_env = true, env = {{ EXTRA = \"yes\" }} }}\n[permissions.local]\ns = [\"*\"]\n",
        harness_exe()
    );
    let path = write("inherit.toml", &toml);
    let o = run_env(
        &[
            "call",
            "--config",
            &path.to_string_lossy(),
            "s__env",
            "--json",
        ],
        &secret,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let env: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(env["structuredContent"]["MCP_TEST_SECRET"], "hunter2");
    assert_eq!(env["structuredContent"]["EXTRA"], "yes");
    // The gateway's sealing keys and tokens are the harness's own, whatever is inherited.
    for withheld in [
        "MCP_HARNESS_GATEWAY_KEYS",
        "MCP_HARNESS_ADMIN_TOKEN",
        "MCP_HARNESS_METRICS_TOKEN",
    ] {
        assert!(env["structuredContent"].get(withheld).is_none(), "{env}");
    }
    let _ = std::fs::remove_file(path);
}

// Hardening item 12: server text is printed without escape sequences.
#[test]
fn item_12_server_text_reaches_the_terminal_without_escape_sequences() {
    let o = run(&["call", "--stdio", &demo_cmd("s"), "ansi"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\r'),
        "{out:?}"
    );
    assert!(out.contains("cleared your screen"), "{out:?}");
    let o = run(&["tools", "--stdio", &demo_cmd("s")]);
    assert!(!stdout(&o).contains('\u{1b}'), "descriptions too");
}

// A server's description of any length is shown cut on its line (`--json` has it
// whole): a megabyte description printed once per match was a megabyte line.
#[test]
fn a_long_description_is_cut_on_its_line() {
    let server = format!("{} --huge-schema 1", demo_cmd("s"));
    for args in [
        vec!["tools", "--stdio", &server],
        vec!["search", "--stdio", &server, "huge xxx"],
    ] {
        let o = run(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let out = stdout(&o);
        let line = out
            .lines()
            .find(|l| l.contains("__huge "))
            .unwrap_or_else(|| panic!("{args:?}: no line for the tool: {out:.500}"));
        assert!(
            line.chars().count() < 500 && line.ends_with('…'),
            "{args:?}: {} characters",
            line.chars().count()
        );
    }
}

// Hardening item 13: the command line never widens a config file's grants.
#[test]
fn item_13_ad_hoc_servers_are_granted_and_the_files_own_grants_stay_as_written() {
    let toml = format!(
        "[[servers]]\nid = \"files\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"files\"] }}\n[permissions.local]\nfiles = [\"echo\"]\n",
        harness_exe()
    );
    let path = write("grants.toml", &toml);
    let p = path.to_string_lossy().to_string();
    let extra = demo_cmd("extra");
    let o = run(&[
        "call",
        "--config",
        &p,
        "--stdio",
        &extra,
        "files__add",
        r#"{"a":1,"b":2}"#,
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "not granted by the file: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("denied"), "{}", stderr(&o));
    let o = run(&[
        "call",
        "--config",
        &p,
        "--stdio",
        &extra,
        "stdio1__add",
        r#"{"a":1,"b":2}"#,
    ]);
    assert!(
        o.status.success(),
        "the ad hoc server is granted: {}",
        stderr(&o)
    );
    let o = run(&[
        "call",
        "--config",
        &p,
        "--stdio",
        &extra,
        "files__echo",
        r#"{"text":"ok"}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_file(path);
}

// Hardening item 17: startup failures are immediate and named.
#[test]
fn item_17_a_server_that_cannot_start_makes_the_cli_exit_3_naming_it_and_tools_lists_the_rest() {
    let o = run(&[
        "call",
        "--stdio",
        "/nonexistent/mcp-server",
        "echo",
        r#"{"text":"x"}"#,
    ]);
    assert_eq!(o.status.code(), Some(3));
    let err = stderr(&o);
    assert!(
        err.contains("server stdio1 failed") && err.contains("could not start"),
        "{err}"
    );
    assert!(!err.contains("no server offers"), "{err}");
    let o = run(&[
        "tools",
        "--stdio",
        "/nonexistent/mcp-server",
        "--stdio",
        &demo_cmd("ok"),
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "non-zero when an enabled server failed"
    );
    assert!(
        stdout(&o).contains("stdio2__echo"),
        "the others are listed: {}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("server stdio1 failed"),
        "{}",
        stderr(&o)
    );
    let o = run(&["tools", "--http", "not a url"]);
    assert_eq!(o.status.code(), Some(2), "an invalid URL is a usage error");
    assert!(stderr(&o).contains("transport.url"), "{}", stderr(&o));
}

// Hardening item 9: mcpServers names become valid ids, and the mapping is printed.
#[test]
fn item_09_mcp_servers_names_are_mapped_to_valid_ids_and_the_mapping_is_printed() {
    let json = format!(
        r#"{{"mcpServers": {{"my files_": {{"command": {:?}, "args": ["demo-server", "x"]}}}}}}"#,
        harness_exe()
    );
    let path = write("mapped.json", &json);
    let o = run(&["tools", "--config", &path.to_string_lossy()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("\"my files_\" is named \"my_files\""),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("my_files__echo"), "{}", stdout(&o));
    let _ = std::fs::remove_file(path);
}

// ---------------------------------------------------------------------------------------
// README promises (numbers from the promises audit): one test each.

/// A TOML `[[servers]]` entry: the demo server named `id` over stdio, with `more` keys.
fn toml_demo(id: &str, more: &str) -> String {
    format!(
        "[[servers]]\nid = {id:?}\n{more}transport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", {id:?}] }}\n",
        harness_exe()
    )
}

/// Writes `text` to a fresh file named `name` (the extension picks the format).
fn config_file(tag: &str, name: &str, text: &str) -> std::path::PathBuf {
    let path = scratch_dir().join(format!("{tag}-{name}"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// `run` without `RUST_LOG`: the program's default log level (`warn`).
fn run_default_log(args: &[&str]) -> Output {
    Command::new(harness_exe())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run mcp-harness")
}

fn qualified_names(o: &Output) -> Vec<String> {
    stdout(o)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

// #7: `tools --tag T` lists only the tools of servers tagged T.
#[test]
fn promise_07_tools_tag_lists_only_servers_with_that_tag() {
    let toml = format!(
        "{}{}[permissions.local]\n\"*\" = [\"*\"]\n",
        toml_demo("core1", "tags = [\"core\", \"x\"]\n"),
        toml_demo("other", "tags = [\"extra\"]\n"),
    );
    let path = config_file("tag", "tags.toml", &toml);
    let p = path.to_string_lossy().to_string();
    let all = run(&["tools", "--config", &p]);
    assert!(all.status.success(), "{}", stderr(&all));
    let names = qualified_names(&all);
    assert!(
        names.contains(&"core1__echo".to_string()) && names.contains(&"other__echo".to_string()),
        "without --tag both servers are listed: {names:?}"
    );
    let tagged = run(&["tools", "--config", &p, "--tag", "core"]);
    assert!(tagged.status.success(), "{}", stderr(&tagged));
    let names = qualified_names(&tagged);
    assert!(names.contains(&"core1__echo".to_string()), "{names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("core1__")),
        "only servers tagged core: {names:?}"
    );
    let json = run(&["tools", "--config", &p, "--tag", "extra", "--json"]);
    let tools: Vec<Value> = serde_json::from_str(&stdout(&json)).expect("json");
    assert!(!tools.is_empty(), "{}", stderr(&json));
    assert!(
        tools.iter().all(|t| t["server"] == "other"),
        "only servers tagged extra: {tools:?}"
    );
    let none = run(&["tools", "--config", &p, "--tag", "nobody", "--json"]);
    let tools: Vec<Value> = serde_json::from_str(&stdout(&none)).expect("json");
    assert!(tools.is_empty(), "no server has the tag: {tools:?}");
    let _ = std::fs::remove_file(path);
}

/// `tools/list` asked of a demo server directly: one raw JSON-RPC line on its stdin,
/// carrying the modern `_meta` envelope, and its reply read from its stdout.
fn raw_tools_list(args: &[&str]) -> Value {
    use std::io::{BufRead, Write};
    let mut child = Command::new(harness_exe())
        .arg("demo-server")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn demo server");
    let request = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/list",
        "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}, "url": {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "raw-test-client", "version": "0"}
        }}
    });
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{request}").expect("write request");
    stdin.flush().expect("flush");
    let reader = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut reply = Value::Null;
    for line in reader.lines() {
        let v: Value = serde_json::from_str(&line.expect("read")).expect("a JSON line");
        if v["id"] == 1 {
            reply = v;
            break;
        }
    }
    drop(stdin); // EOF: the demo server exits.
    let _ = child.wait();
    assert!(reply["result"].is_object(), "tools/list answered: {reply}");
    reply["result"].clone()
}

// #8: `tools --json` prints each tool's qualified name, bare name, server and
// `inputSchema` exactly as the server sent it.
#[test]
fn promise_08_tools_json_prints_each_input_schema_exactly_as_the_server_sent_it() {
    let direct = raw_tools_list(&["alpha", "--extra-tools", "2"]);
    assert!(direct.get("nextCursor").is_none(), "one page: {direct}");
    let sent = direct["tools"].as_array().expect("tools").clone();
    assert!(sent.len() > 10, "{sent:?}");
    let o = run(&[
        "tools",
        "--stdio",
        &demo_cmd("alpha --extra-tools 2"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    let sent_names: std::collections::BTreeSet<&str> =
        sent.iter().filter_map(|t| t["name"].as_str()).collect();
    let listed_names: std::collections::BTreeSet<&str> =
        listed.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(listed_names, sent_names, "every tool the server sent");
    for tool in &sent {
        let name = tool["name"].as_str().expect("name");
        let entry = listed.iter().find(|t| t["name"] == name).expect("listed");
        assert_eq!(entry["qualified"], format!("stdio1__{name}"), "{entry}");
        assert_eq!(entry["server"], "stdio1", "{entry}");
        assert_eq!(
            entry["inputSchema"], tool["inputSchema"],
            "{name}: the whole inputSchema, as sent"
        );
    }
    // The nested vendor annotation survives too (not only `required`).
    let region = listed
        .iter()
        .find(|t| t["name"] == "region_echo")
        .expect("region_echo");
    assert_eq!(
        region["inputSchema"]["properties"]["region"]["x-mcp-header"],
        "Region"
    );
}

// #11: URL-mode elicitation prints the full URL and asks for consent; the program never
// opens it. Without a terminal (and without consent) the request is declined: exit 1.
#[test]
fn promise_11_url_mode_elicitation_prints_the_full_url_never_opens_it_and_declines_without_consent()
{
    // Anything that would open a URL writes a marker instead.
    let trap = temp_file("url-trap");
    std::fs::create_dir_all(&trap).expect("trap dir");
    let marker = trap.join("opened");
    for opener in [
        "xdg-open",
        "open",
        "gio",
        "sensible-browser",
        "x-www-browser",
        "www-browser",
        "firefox",
        "chromium",
        "google-chrome",
    ] {
        let path = trap.join(opener);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho \"$0 $*\" >> {:?}\n", marker.display()),
        )
        .expect("write opener");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let path_env = format!(
        "{}:{}",
        trap.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let browser = trap.join("firefox").display().to_string();
    let env = [("PATH", path_env.as_str()), ("BROWSER", browser.as_str())];
    let server = demo_cmd("s");
    let url_args = r#"{"n":1,"mode":"url"}"#;
    // stdin is not a terminal (Command::output gives it none), and no --answers.
    for extra in [&[][..], &["--answers", "{}"][..]] {
        let mut args = vec!["call", "--stdio", &server, "many_inputs", url_args];
        args.extend_from_slice(extra);
        let o = run_env(&args, &env);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "declined, {extra:?}: {err}");
        assert!(
            err.contains("https://example.com/sign-in"),
            "the full URL is shown: {err}"
        );
        assert!(err.contains("declined"), "{err}");
        assert!(
            !stdout(&o).contains("got 1 answers"),
            "no consent was sent: {}",
            stdout(&o)
        );
        // The hint names what consents, and what it names does.
        assert!(err.contains(r#""!url": "accept""#), "{err}");
    }
    let o = run_env(
        &[
            "call",
            "--stdio",
            &server,
            "many_inputs",
            url_args,
            "--answers",
            r#"{"!url": "accept"}"#,
        ],
        &env,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("got 1 answers"), "{}", stdout(&o));
    // A page on this machine or a private network is said to be one: a remote server
    // may name it to have a browser act on a local service.
    for (url, said) in [
        ("http://127.0.0.1:9/reset", "host 127.0.0.1, this machine"),
        ("https://10.1.2.3/admin", "host 10.1.2.3, a private network"),
        ("https://example.com/x", "host example.com)"),
    ] {
        let args_json = serde_json::json!({"n": 1, "mode": "url", "url": url}).to_string();
        let o = run_env(
            &["call", "--stdio", &server, "many_inputs", &args_json],
            &env,
        );
        assert!(stderr(&o).contains(said), "{url}: {}", stderr(&o));
    }
    // A URL that is no web page a person can judge (another scheme, credentials in it,
    // plain HTTP to another host) is declined before anyone is asked.
    for bad in [
        "javascript:alert(1)",
        "file:///etc/passwd",
        "http://evil.example/sign-in",
        "https://user:pw@example.com/",
    ] {
        let args_json = serde_json::json!({"n": 1, "mode": "url", "url": bad}).to_string();
        let o = run_env(
            &["call", "--stdio", &server, "many_inputs", &args_json],
            &env,
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains("not an https URL"), "{bad}: {err}");
        assert!(
            !err.contains("open this URL"),
            "{bad} is not offered: {err}"
        );
    }
    // On a terminal (a pty from util-linux `script`) the program asks for consent, and
    // only a yes sends it.
    let cmd = format!(
        "{} call --stdio '{server}' many_inputs '{url_args}'",
        harness_exe()
    );
    for (typed, code, answered) in [("y\n", 0, true), ("n\n", 1, false)] {
        let o = on_a_terminal(&cmd, "consent? [y/N]", typed, &env);
        let screen = stdout(&o);
        assert_eq!(o.status.code(), Some(code), "{typed:?}: {screen}");
        assert!(
            screen.contains("https://example.com/sign-in"),
            "the full URL is shown: {screen}"
        );
        assert!(screen.contains("consent? [y/N]"), "asks: {screen}");
        // The harness's own line last, naming the server and host, under the message.
        assert!(
            screen.contains(", host example.com: done, and do you consent? [y/N]"),
            "{screen}"
        );
        assert_eq!(screen.contains("got 1 answers"), answered, "{screen}");
    }
    assert!(
        !marker.exists(),
        "something opened the URL: {:?}",
        std::fs::read_to_string(&marker)
    );
    let _ = std::fs::remove_dir_all(trap);
}

/// Runs `cmd` on a terminal (a pty from util-linux `script`; what it shows is the
/// output's stdout), types `typed` into it once `prompt` is on the screen (a yes or no
/// takes no line typed before it is asked), then ends the input.
fn on_a_terminal(cmd: &str, prompt: &str, typed: &str, env: &[(&str, &str)]) -> Output {
    use std::io::{Read, Write};
    let mut child = terminal_command(cmd, env)
        .spawn()
        .expect("this test needs `script` (util-linux) for a terminal");
    let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = std::thread::spawn({
        let screen = screen.clone();
        let mut out = child.stdout.take().expect("stdout");
        move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = out.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                screen.lock().expect("lock").extend_from_slice(&chunk[..n]);
            }
        }
    });
    let asked = || String::from_utf8_lossy(&screen.lock().expect("lock")).contains(prompt);
    let started = std::time::Instant::now();
    while !asked() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(typed.as_bytes()).expect("type the answer");
    drop(input);
    let mut o = child.wait_with_output().expect("wait");
    reader.join().expect("reader");
    o.stdout = std::mem::take(&mut *screen.lock().expect("lock"));
    o
}

/// Runs `cmd` on a terminal with nothing typed and its input left open, for up to 30 s:
/// how it ended (`None`: still running then, and killed), and its output.
fn on_a_terminal_left_open(cmd: &str) -> (Option<std::process::ExitStatus>, Output) {
    let mut child = terminal_command(cmd, &[]).spawn().expect("script");
    let input = child.stdin.take();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(input);
    let o = child.wait_with_output().expect("wait");
    (status, o)
}

fn terminal_command(cmd: &str, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new("script");
    c.args(["-qec", cmd, "/dev/null"])
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

// The terminal is read only for a question: a line typed beyond the answers (for the
// shell, while the tool runs) is left to whoever reads next. Before, a reader ahead of
// the questions took one more line and dropped it at exit.
#[test]
fn a_line_typed_beyond_the_answers_is_left_for_the_shell() {
    let cmd = format!(
        "{} call --stdio '{}' many_inputs '{{\"n\":1}}'; read x; echo \"shell:[$x]\"",
        harness_exe(),
        demo_cmd("s")
    );
    let cmd = format!("sh -c '{}'", cmd.replace('\'', "'\\''"));
    let o = on_a_terminal(&cmd, "x (string):", "abc\nSEEN\n", &[]);
    let screen = stdout(&o);
    assert!(screen.contains("got 1 answers"), "{screen}");
    assert!(screen.contains("shell:[SEEN]"), "{screen}");
}

// A background job of the terminal is not asked: reading the terminal (or flushing its
// input) would have it stopped by SIGTTIN or SIGTTOU until `fg`, its deadline with it.
// It declines, and ends.
#[test]
fn a_background_job_declines_rather_than_being_stopped_by_the_terminal() {
    let cmd = format!(
        "set -m; {} call --stdio '{}' many_inputs '{{\"n\":1,\"mode\":\"empty\"}}' & job=$!; \
         for i in $(seq 100); do kill -0 $job 2>/dev/null || break; sleep 0.1; done; \
         state=$(ps -o stat= -p $job); echo \"state:[$state]\"; kill -9 $job 2>/dev/null; \
         wait $job; echo \"exit:$?\"",
        harness_exe(),
        demo_cmd("s")
    );
    let (status, o) = on_a_terminal_left_open(&format!("sh -c '{}'", cmd.replace('\'', "'\\''")));
    let screen = stdout(&o);
    assert!(status.is_some(), "{screen}");
    assert!(
        screen.contains("state:[]"),
        "the job is still there: {screen}"
    );
    assert!(screen.contains("exit:1"), "declined: {screen}");
    assert!(!screen.contains("Delete everything?"), "asked: {screen}");
}

// A form with no fields (how a server asks for a confirmation) is accepted on a
// terminal only by a yes; before, it was accepted at once, nothing asked.
#[test]
fn a_confirmation_with_no_fields_is_accepted_only_by_a_yes() {
    let cmd = format!(
        "{} call --stdio '{}' many_inputs '{{\"n\":1,\"mode\":\"empty\"}}'",
        harness_exe(),
        demo_cmd("s")
    );
    for (typed, code) in [("y\n", 0), ("\n", 1), ("no\n", 1)] {
        let o = on_a_terminal(&cmd, "accept? [y/N]", typed, &[]);
        let screen = stdout(&o);
        assert_eq!(o.status.code(), Some(code), "{typed:?}: {screen}");
        assert!(screen.contains("Delete everything?"), "{screen}");
        assert!(screen.contains("accept? [y/N]"), "asks: {screen}");
        assert!(
            screen
                .lines()
                .any(|l| l.trim_start().starts_with("server ") && l.contains(": accept? [y/N]")),
            "the prompt names the server: {screen}"
        );
        assert_eq!(screen.contains("got 1 answers"), code == 0, "{screen}");
    }
    // A y typed before the question was asked (pasted ahead) does not accept it.
    let o = on_a_terminal(&cmd, "", "y\n", &[]);
    let screen = stdout(&o);
    assert_ne!(o.status.code(), Some(0), "{screen}");
    assert!(screen.contains("accept? [y/N]"), "asks: {screen}");
    assert!(!screen.contains("got 1 answers"), "{screen}");
}

// A question on the terminal that no one answers is withdrawn when its call's time for
// input runs out: the program ends (exit 1) with the terminal still open, where the
// read it was blocked in held it until the next Enter.
#[test]
fn an_unanswered_question_is_withdrawn_when_the_calls_time_for_input_runs_out() {
    let toml = format!(
        "input_timeout = \"1s\"\n{}[permissions.local]\nalpha = [\"many_inputs\"]\n",
        toml_demo("alpha", "")
    );
    let path = config_file("withdrawn", "h.toml", &toml);
    let cmd = format!(
        "{} call --config '{}' alpha__many_inputs '{{\"n\":1}}'",
        harness_exe(),
        path.display()
    );
    // Nothing typed, and the terminal's input left open.
    let (status, o) = on_a_terminal_left_open(&cmd);
    let screen = stdout(&o);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{screen}");
    assert!(screen.contains("Which?"), "it was asked: {screen}");
    assert!(
        screen.contains("(the question was withdrawn)"),
        "withdrawn, not left to the runtime's end: {screen}"
    );
}

// #14: `--agent ID` picks the caller whose grants apply (over the file's `agent`).
#[test]
fn promise_14_agent_picks_the_caller_whose_grants_apply() {
    let toml = format!(
        "agent = \"planner\"\n{}[permissions.planner]\nalpha = [\"echo\"]\n[permissions.other]\nalpha = [\"add\"]\n",
        toml_demo("alpha", "")
    );
    let path = config_file("agent", "agents.toml", &toml);
    let p = path.to_string_lossy().to_string();
    let o = run(&[
        "call",
        "--config",
        &p,
        "--agent",
        "other",
        "add",
        r#"{"a":1,"b":2}"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "other may add: {}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "3");
    let o = run(&[
        "call",
        "--config",
        &p,
        "--agent",
        "other",
        "echo",
        r#"{"text":"x"}"#,
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "other may not echo: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("denied"), "{}", stderr(&o));
    // The file's agent (planner) is the default, with the opposite grants.
    let o = run(&["call", "--config", &p, "add", r#"{"a":1,"b":2}"#]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "planner may not add: {}",
        stderr(&o)
    );
    let o = run(&["call", "--config", &p, "echo", r#"{"text":"x"}"#]);
    assert_eq!(o.status.code(), Some(0), "planner may echo: {}", stderr(&o));
    // And `tools` shows what the picked agent may use.
    let o = run(&["tools", "--config", &p, "--agent", "other"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(qualified_names(&o), ["alpha__add"], "{}", stdout(&o));
    let _ = std::fs::remove_file(path);
}

// #17: a call that hits the round cap (default 10) fails with exit 1.
#[test]
fn promise_17_a_call_that_hits_the_round_cap_exits_1() {
    let record = temp_file("roundcap");
    let server = demo_cmd(&format!("s --record {}", record.display()));
    let o = run(&["call", "--stdio", &server, "forever"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("more than 10 times"),
        "names the round cap: {err}"
    );
    assert!(stdout(&o).trim().is_empty(), "{}", stdout(&o));
    let calls = recorded(&record)
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .count();
    assert_eq!(calls, 11, "the first request and 10 rounds");
    let _ = std::fs::remove_file(record);
}

// #33: stdio `cwd` (TOML and mcpServers) and mcpServers `env` reach the server.
#[test]
fn promise_33_stdio_cwd_and_mcp_servers_env_reach_the_server() {
    let dir = temp_file("cwd-dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let real = std::fs::canonicalize(&dir).expect("canonical");
    assert_ne!(std::env::current_dir().expect("cwd"), real);
    let toml = format!(
        "[[servers]]\nid = \"s\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"s\"], cwd = {:?} }}\n[permissions.local]\ns = [\"*\"]\n",
        harness_exe(),
        dir.display().to_string()
    );
    let path = config_file("cwd", "cwd.toml", &toml);
    let o = run(&["call", "--config", &path.to_string_lossy(), "s__cwd"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), real.display().to_string(), "TOML cwd");
    let json = serde_json::json!({"mcpServers": {"files": {
        "command": harness_exe(),
        "args": ["demo-server", "files"],
        "cwd": dir,
        "env": {"MCP_HARNESS_FROM_JSON": "yes", "OTHER_ONE": "2"}
    }}});
    let json_path = config_file("cwd", "mcp.json", &json.to_string());
    let jp = json_path.to_string_lossy().to_string();
    let o = run(&["call", "--config", &jp, "files__cwd"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim(),
        real.display().to_string(),
        "mcpServers cwd"
    );
    let o = run(&["call", "--config", &jp, "files__env", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let result: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let vars = &result["structuredContent"];
    assert_eq!(vars["MCP_HARNESS_FROM_JSON"], "yes", "{vars}");
    assert_eq!(vars["OTHER_ONE"], "2", "{vars}");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(json_path);
    let _ = std::fs::remove_dir_all(dir);
}

// #34: HTTP `headers` reach the server (TOML `transport.headers`, mcpServers `headers`).
#[tokio::test]
async fn promise_34_http_headers_reach_the_server_from_toml_and_mcp_servers() {
    let http = HttpServer::demo(&["web"]).await;
    let toml = format!(
        "[[servers]]\nid = \"web\"\ntransport = {{ type = \"http\", url = {:?}, headers = {{ X-Api-Key = \"k-toml\", X-Team = \"blue\" }} }}\n[permissions.local]\nweb = [\"*\"]\n",
        http.url
    );
    let toml_path = config_file("headers", "headers.toml", &toml);
    let json = serde_json::json!({"mcpServers": {"web": {
        "type": "http", "url": http.url, "headers": {"X-Api-Key": "k-json"}
    }}});
    let json_path = config_file("headers", "mcp.json", &json.to_string());
    let (tp, jp) = (
        toml_path.to_string_lossy().to_string(),
        json_path.to_string_lossy().to_string(),
    );
    let (from_toml, from_json) = tokio::task::spawn_blocking(move || {
        (
            run(&["call", "--config", &tp, "web__whoami", "--json"]),
            run(&["call", "--config", &jp, "web__whoami", "--json"]),
        )
    })
    .await
    .expect("join");
    assert!(from_toml.status.success(), "{}", stderr(&from_toml));
    let r: Value = serde_json::from_str(&stdout(&from_toml)).expect("json");
    let headers = &r["structuredContent"]["headers"];
    assert_eq!(headers["x-api-key"], "k-toml", "{headers}");
    assert_eq!(headers["x-team"], "blue", "{headers}");
    assert!(from_json.status.success(), "{}", stderr(&from_json));
    let r: Value = serde_json::from_str(&stdout(&from_json)).expect("json");
    let headers = &r["structuredContent"]["headers"];
    assert_eq!(headers["x-api-key"], "k-json", "{headers}");
    let _ = std::fs::remove_file(toml_path);
    let _ = std::fs::remove_file(json_path);
}

// #39: mcpServers `"type": "streamable-http"` is an HTTP server.
#[tokio::test]
async fn promise_39_mcp_servers_type_streamable_http_works() {
    let http = HttpServer::demo(&["web"]).await;
    let json =
        serde_json::json!({"mcpServers": {"web": {"type": "streamable-http", "url": http.url}}});
    let path = config_file("streamable", "mcp.json", &json.to_string());
    let p = path.to_string_lossy().to_string();
    let (tools, call) = tokio::task::spawn_blocking(move || {
        (
            run(&["tools", "--config", &p]),
            run(&[
                "call",
                "--config",
                &p,
                "web__echo",
                r#"{"text":"over streamable http"}"#,
            ]),
        )
    })
    .await
    .expect("join");
    assert!(tools.status.success(), "{}", stderr(&tools));
    assert!(
        qualified_names(&tools).contains(&"web__echo".to_string()),
        "{}",
        stdout(&tools)
    );
    assert!(call.status.success(), "{}", stderr(&call));
    assert_eq!(stdout(&call).trim(), "over streamable http");
    let _ = std::fs::remove_file(path);
}

// #40: mcpServers `"disabled": true`: listed as stopped, no tools, never started.
#[test]
fn promise_40_a_disabled_mcp_server_is_stopped_has_no_tools_and_never_starts() {
    let (record, on_record) = (temp_file("disabled"), temp_file("enabled"));
    let json = serde_json::json!({"mcpServers": {
        "off": {"command": harness_exe(), "args": ["demo-server", "off", "--record", record], "disabled": true},
        "on": {"command": harness_exe(), "args": ["demo-server", "on", "--record", on_record], "disabled": false}
    }});
    let path = config_file("disabled", "mcp.json", &json.to_string());
    let p = path.to_string_lossy().to_string();
    let o = run(&["status", "--config", &p, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let status: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    let state = |id: &str| {
        status
            .iter()
            .find(|s| s["id"] == id)
            .map(|s| s["state"].clone())
    };
    assert_eq!(state("off"), Some(Value::from("stopped")), "{status:?}");
    assert_eq!(state("on"), Some(Value::from("ready")), "{status:?}");
    let off = status.iter().find(|s| s["id"] == "off").expect("off");
    assert!(off["pid"].is_null(), "no process: {off}");
    let o = run(&["tools", "--config", &p]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names = qualified_names(&o);
    assert!(names.contains(&"on__echo".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("off__")),
        "no tools from the disabled server: {names:?}"
    );
    assert!(
        on_record.exists(),
        "a server that runs creates its --record file"
    );
    assert!(
        !record.exists(),
        "the disabled server's process ran (its --record file exists)"
    );
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(on_record);
}

// #41: VS Code's `servers` object works like `mcpServers`.
#[tokio::test]
async fn promise_41_vs_code_servers_object_works() {
    let http = HttpServer::demo(&["web"]).await;
    // The shape of a VS Code `.vscode/mcp.json`, `inputs` included.
    let json = serde_json::json!({
        "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
        "servers": {
            "files": {"type": "stdio", "command": harness_exe(), "args": ["demo-server", "files"]},
            "web": {"type": "http", "url": http.url}
        }
    });
    let path = config_file("vscode", "mcp.json", &json.to_string());
    let p = path.to_string_lossy().to_string();
    let (tools, call) = tokio::task::spawn_blocking(move || {
        (
            run(&["tools", "--config", &p]),
            run(&[
                "call",
                "--config",
                &p,
                "files__echo",
                r#"{"text":"from vs code"}"#,
            ]),
        )
    })
    .await
    .expect("join");
    assert!(tools.status.success(), "{}", stderr(&tools));
    let names = qualified_names(&tools);
    for name in ["files__echo", "web__echo"] {
        assert!(names.contains(&name.to_string()), "{name} in {names:?}");
    }
    assert!(call.status.success(), "{}", stderr(&call));
    assert_eq!(stdout(&call).trim(), "from vs code");
    let _ = std::fs::remove_file(path);
}

// #42: other keys in an mcpServers entry are ignored, with a warning naming them.
#[test]
fn promise_42_other_mcp_servers_keys_are_ignored_with_a_warning() {
    let json = serde_json::json!({"mcpServers": {"files": {
        "command": harness_exe(),
        "args": ["demo-server", "files"],
        "autoApprove": ["echo"],
        "alwaysAllow": []
    }}});
    let path = config_file("ignored", "mcp.json", &json.to_string());
    let o = run_default_log(&[
        "call",
        "--config",
        &path.to_string_lossy(),
        "files__echo",
        r#"{"text":"still works"}"#,
    ]);
    assert!(o.status.success(), "ignored, not an error: {}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "still works");
    let err = stderr(&o);
    assert!(err.contains("ignoring a key"), "a warning: {err}");
    assert!(
        err.contains("autoApprove") && err.contains("alwaysAllow"),
        "naming each key: {err}"
    );
    // A file without such keys has no such warning.
    let clean = serde_json::json!({"mcpServers": {"files": {"command": harness_exe(), "args": ["demo-server", "files"]}}});
    let clean_path = config_file("ignored", "clean.json", &clean.to_string());
    let o = run_default_log(&["tools", "--config", &clean_path.to_string_lossy()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("ignoring a key"), "{}", stderr(&o));
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(clean_path);
}

// #43: the legacy HTTP+SSE transport (`"type": "sse"`) is refused with a message: exit 2.
#[test]
fn promise_43_mcp_servers_type_sse_is_refused_with_a_message_and_exit_2() {
    let json = serde_json::json!({"mcpServers": {
        "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        "files": {"command": harness_exe(), "args": ["demo-server", "files"]}
    }});
    let path = config_file("sse", "mcp.json", &json.to_string());
    let o = run(&["tools", "--config", &path.to_string_lossy()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("mcpServers.old.type"), "names the key: {err}");
    assert!(
        err.contains("SSE") && err.contains("not supported"),
        "says why: {err}"
    );
    assert!(err.contains("mcp.json"), "names the file: {err}");
    assert!(err.lines().count() <= 2, "{err}");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    let _ = std::fs::remove_file(path);
}

/// Runs the program and measures how long it took.
fn timed(args: &[&str]) -> (Output, std::time::Duration) {
    let start = std::time::Instant::now();
    let o = run(args);
    (o, start.elapsed())
}

// #15: `--wait DURATION` bounds how long startup may take: past it, the command goes on
// with the servers that are ready.
#[test]
fn promise_15_wait_bounds_how_long_startup_may_take() {
    let (bad, good) = (demo_cmd("a --crash-on-start"), demo_cmd("b"));
    let servers = ["--stdio", bad.as_str(), "--stdio", good.as_str()];
    let with = |cmd: &[&str], wait: Option<&str>| {
        let mut args: Vec<&str> = cmd.to_vec();
        args.extend_from_slice(&servers);
        if let Some(w) = wait {
            args.extend_from_slice(&["--wait", w]);
        }
        timed(&args)
    };
    // Without --wait (30 s), startup waits until the crashing server has restarted five
    // times with backoff (it is not given up yet: its limit is ten).
    let (o, unbounded) = with(&["status", "--json"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let status: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    assert!(
        status[0]["state"] == "restarting" || status[0]["state"] == "starting",
        "{status:?}"
    );
    assert!(status[0]["restarts"].as_u64() >= Some(5), "{status:?}");
    assert_eq!(status[1]["state"], "ready", "{status:?}");
    // With a short --wait, the command goes on while the first is still restarting.
    let (o, bounded) = with(&["status", "--json"], Some("200ms"));
    assert!(o.status.success(), "{}", stderr(&o));
    let status: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    assert_ne!(status[0]["state"], "failed", "not waited for: {status:?}");
    assert_eq!(status[1]["state"], "ready", "{status:?}");
    assert!(
        bounded < unbounded / 2,
        "--wait 200ms took {bounded:?}, without it {unbounded:?}"
    );
    // And the good server serves a call.
    let (o, bounded) = with(&["call", "stdio2__echo", r#"{"text":"hi"}"#], Some("200ms"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "hi");
    assert!(
        bounded < unbounded / 2,
        "--wait 200ms took {bounded:?}, without it {unbounded:?}"
    );
}

// #15, for `tools`: past --wait, `tools` goes on without the server that is still
// starting and lists the others.
#[test]
fn promise_15_tools_with_wait_goes_on_without_a_server_still_starting() {
    let (bad, good) = (demo_cmd("a --crash-on-start"), demo_cmd("b"));
    let args = ["tools", "--stdio", &bad, "--stdio", &good];
    let (_, unbounded) = timed(&args);
    let mut waited = args.to_vec();
    waited.extend_from_slice(&["--wait", "200ms"]);
    let (o, bounded) = timed(&waited);
    assert!(
        qualified_names(&o).contains(&"stdio2__echo".to_string()),
        "{}",
        stdout(&o)
    );
    assert!(
        bounded < unbounded / 2,
        "--wait 200ms took {bounded:?}, without it {unbounded:?}"
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "no server failed within the wait: {}",
        stderr(&o)
    );
}

#[test]
fn search_prints_the_most_relevant_tools_first_as_text_and_json() {
    let (modern, legacy) = (demo_cmd("alpha"), demo_cmd("beta --era legacy"));
    let o = run(&[
        "search",
        "--stdio",
        &modern,
        "--stdio",
        &legacy,
        "adds two integers",
        "-k",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l.contains("__add ")), "{out}");
    let o = run(&[
        "search",
        "--stdio",
        &modern,
        "environment variables",
        "--json",
    ]);
    let found: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(found[0]["qualified"], "stdio1__env", "{found:?}");
    assert!(found[0]["score"].as_f64().is_some_and(|s| s > 0.0));
    assert!(found[0]["definition"]["inputSchema"].is_object());
    // A server that could not be listed may hold a better match: named, and exit 3,
    // with what the others hold.
    let unlisted = demo_cmd("beta --list-input-required");
    let o = run(&[
        "search",
        "--stdio",
        &modern,
        "--stdio",
        &unlisted,
        "adds two integers",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("could not list stdio2"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("stdio1__add"), "{}", stdout(&o));
    // No tool asked for is a usage error, not "no tool matches".
    let o = run(&["search", "--stdio", &modern, "adds", "-k", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--limit"), "{}", stderr(&o));
}

#[test]
fn status_watch_redraws_a_table_of_servers_every_second_until_ctrl_c() {
    use std::io::{BufRead, BufReader};
    let server = demo_cmd("alpha");
    let mut child = Command::new(harness_exe())
        .args(["status", "--watch", "--stdio", &server])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Two tables in which the server is ready (not a terminal: printed one after another).
    let mut headers = 0;
    let mut ready = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ready < 2 && std::time::Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(5)) else {
            break;
        };
        if line.starts_with("SERVER") {
            assert!(line.contains("RESTARTS") && line.contains("P50"), "{line}");
            headers += 1;
        }
        if line.starts_with("stdio1") && line.contains("ready") {
            assert!(line.contains("modern"), "{line}");
            ready += 1;
        }
    }
    assert!(
        ready >= 2 && headers >= 2,
        "two refreshes showed the server ready"
    );
    send_signal("-INT", &child.id().to_string());
    let exit = child.wait().expect("wait");
    assert_eq!(exit.code(), Some(0), "Ctrl-C ends a watch normally");
}

#[test]
fn a_config_files_text_reaches_the_terminal_without_escape_sequences() {
    // A cloned repository's `.mcp.json` names what it likes; errors and the name
    // mapping quote it.
    for (name, json) in [
        (
            "escapes-bad.json",
            r#"{"mcpServers": {"\u001b]0;owned\u0007\u001b[2J": 1}}"#.to_string(),
        ),
        (
            "escapes-env.json",
            r#"{"mcpServers": {"s": {"command": "${\u001b[2J}"}}}"#.to_string(),
        ),
        (
            "escapes-key.json",
            r#"{"mcpServers": {"s\u001b[2J": {"command": "nonexistent-x", "bogus\u001b[2J": 1}}}"#
                .to_string(),
        ),
        (
            "escapes-mapped.json",
            format!(
                r#"{{"mcpServers": {{"a\u001b[31mb\u009b2J": {{"command": {:?}, "args": ["demo-server", "x"]}}}}}}"#,
                harness_exe()
            ),
        ),
    ] {
        let path = write(name, &json);
        // Warnings on: the key a program does not use is logged.
        let o = Command::new(harness_exe())
            .args(["tools", "--config", &path.to_string_lossy()])
            .env("RUST_LOG", "warn")
            .output()
            .expect("run mcp-harness");
        let err = stderr(&o);
        assert!(
            !err.contains(['\u{1b}', '\u{7}', '\u{9b}']),
            "{name}: {err:?}"
        );
        let _ = std::fs::remove_file(path);
    }
}

// The sampling API key is read by the harness that uses it: signing out (or in) needs no
// key in the environment, and a command that starts the harness names the variable.
#[test]
fn logout_needs_no_sampling_key_and_a_started_harness_does() {
    let text = format!(
        "{}\n[sampling]\nprovider = \"openai\"\nmodel = \"m\"\napi_key_env = \"MCP_HARNESS_SURELY_UNSET\"\n",
        toml_demo("alpha", "")
    );
    let config = config_file("sampling-key", "harness.toml", &text);
    let config = config.to_string_lossy();
    let tokens = scratch_dir().join("sampling-key-tokens");
    let out = run(&[
        "logout",
        "alpha",
        "--config",
        &config,
        "--tokens",
        &tokens.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("0 token(s) forgotten"),
        "{}",
        stderr(&out)
    );
    let out = run(&["tools", "--config", &config]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sampling.api_key_env")
            && stderr(&out).contains("MCP_HARNESS_SURELY_UNSET"),
        "{}",
        stderr(&out)
    );
    // The key itself written in through `${…}` where its variable's name goes: the
    // error does not print it, though it could pass for a name.
    let text = format!(
        "{}\n[sampling]\nprovider = \"openai\"\nmodel = \"m\"\napi_key_env = \"${{MCP_TEST_SAMPLING_KEY_VALUE}}\"\n",
        toml_demo("alpha", "")
    );
    let config = config_file("sampling-key-value", "harness.toml", &text);
    let out = run_env(
        &["tools", "--config", &config.to_string_lossy()],
        &[("MCP_TEST_SAMPLING_KEY_VALUE", "gsk_abcdef0123456789")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sampling.api_key_env"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("gsk_abcdef"), "{}", stderr(&out));
}

// Signing out of a server the config no longer names (or with no config at all, only
// `--tokens`) forgets its kept tokens: no server has to be configured to sign out.
#[test]
fn logout_of_a_server_no_config_names_forgets_its_tokens() {
    let tokens = scratch_dir().join("logout-gone-tokens");
    let _ = std::fs::remove_dir_all(&tokens);
    let run_logout = |extra: &[&str]| {
        let mut args = vec!["logout", "web", "--tokens"];
        let dir = tokens.to_string_lossy().to_string();
        args.push(&dir);
        args.extend_from_slice(extra);
        run(&args)
    };
    // No tokens and no server of that name: a mistake, as before.
    let out = run_logout(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no server named"), "{}", stderr(&out));
    // A token kept for it (as a FileTokenStore writes it), the config naming no server.
    use mcp_harness::transport::auth::{
        ClientAuth, ClientIdentity, FileTokenStore, Token, TokenKey, TokenStore,
    };
    let store = FileTokenStore::new(tokens.clone());
    let token = Token {
        access_token: "at".into(),
        refresh_token: Some("rt".into()),
        expires_at_ms: None,
        issued_at_ms: None,
        scopes: Vec::new(),
        issuer: "https://idp.example".into(),
        token_endpoint: "https://idp.example/t".into(),
        client: ClientIdentity {
            client_id: "c".into(),
            client_secret: None,
            auth: ClientAuth::None,
        },
        resource: None,
    };
    let key = TokenKey {
        server: "web".into(),
        resource: "https://web.example/mcp".into(),
        identity: None,
    };
    store.put(&key, &token).expect("kept");
    let empty = config_file("logout-gone", "harness.toml", "agent = \"a\"\n");
    let out = run_logout(&["--config", &empty.to_string_lossy()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 token(s) forgotten"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&tokens);
}

/// `serve --stdio` with `shutdown_grace` of `grace`, its one server recording to a file
/// of `tag`'s, once a call to its `hang` tool (which never answers) has reached it: the
/// process, its input (open), and the record.
fn serve_with_a_call_that_hangs(
    tag: &str,
    grace: &str,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::path::PathBuf,
) {
    use std::io::Write;
    let record = scratch_dir().join(format!("{tag}.jsonl"));
    let _ = std::fs::remove_file(&record);
    let config = config_file(
        tag,
        "harness.toml",
        &format!(
            "shutdown_grace = \"{grace}\"\n\n[[servers]]\nid = \"alpha\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"alpha\", \"--record\", {:?}] }}\n\n[permissions.local]\n\"*\" = [\"*\"]\n",
            harness_exe(),
            record.display().to_string()
        ),
    );
    let mut child = Command::new(harness_exe())
        .args(["serve", "--stdio", "--dev-keys", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "alpha__hang", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}}});
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{call}").expect("write");
    let start = std::time::Instant::now();
    while !recorded(&record)
        .iter()
        .any(|r| r["params"]["name"] == "hang")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the call never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, stdin, record)
}

/// `child`'s exit code once it has exited, which must be within 20 s (`why` says what
/// it means when it is not).
fn exit_code_within(child: &mut std::process::Child, why: &str) -> Option<i32> {
    let stopped = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        assert!(stopped.elapsed() < Duration::from_secs(20), "{why}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// A second signal while serve shuts down ends it at once, with the signal's code, and
// its servers with it: the first waits for the calls in flight (here one that never
// ends, with a minute's grace). Before, the second signal was swallowed and serve
// waited the grace out.
#[test]
fn a_second_signal_while_serve_shuts_down_ends_it_at_once() {
    let (mut child, stdin, record) = serve_with_a_call_that_hangs("serve-twice", "60s");
    let pid = child.id().to_string();
    let term = || {
        send_signal("-TERM", &pid);
    };
    term();
    // Time for the first to be taken before the second comes (two signals pending at
    // once are one), on a loaded machine too (deliberate).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the first signal waits for the call in flight"
    );
    term();
    assert_eq!(
        exit_code_within(&mut child, "the second signal did not end serve"),
        Some(143)
    );
    // Killed as serve ends: gone within moments (SIGKILL is not instant).
    let left = || processes_with(&record.display().to_string());
    let gone_by = std::time::Instant::now() + Duration::from_secs(5);
    while !left().is_empty() && std::time::Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(left().is_empty(), "server processes left: {:?}", left());
    drop(stdin);
    let _ = std::fs::remove_file(record);
}

// `serve --stdio` whose client has closed its input waits for the calls still running;
// a SIGTERM then shuts it down as at any other time (calls cut at shutdown_grace).
// Before, the signal was taken and nothing listened for it: serve waited for a call
// that never ended.
#[test]
fn a_signal_after_the_clients_input_ended_still_shuts_serve_down() {
    let (mut child, stdin, record) = serve_with_a_call_that_hangs("serve-eof", "1s");
    drop(stdin);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the call still runs"
    );
    send_signal("-TERM", &child.id().to_string());
    assert_eq!(
        exit_code_within(&mut child, "one signal did not shut serve down"),
        Some(0)
    );
    let _ = std::fs::remove_file(record);
}

// `status --watch` ends at Ctrl-C while its table waits for a reader (piped and not
// read, a terminal paused): before, the write blocked the task that takes the signal.
#[test]
fn status_watch_ends_at_ctrl_c_while_its_output_is_not_read() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    // A gateway of 4,000 servers: one table is more than a pipe holds.
    let body: String = (0..4000)
        .map(|i| format!("mcp_harness_server_state{{mcp_harness_server_id=\"server-{i}\",state=\"ready\"}} 1\n"))
        .collect();
    let scrapes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    std::thread::spawn({
        let scrapes = scrapes.clone();
        move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request);
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                scrapes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let mut child = Command::new(harness_exe())
        .args(["status", "--watch", "--from", &url])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // Held, never read: the first table fills the pipe and its write waits.
    let _unread = child.stdout.take();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while scrapes.load(std::sync::atomic::Ordering::SeqCst) == 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        scrapes.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "scraped"
    );
    std::thread::sleep(Duration::from_millis(1000));
    let interrupted = std::time::Instant::now();
    send_signal("-INT", &child.id().to_string());
    let code = exit_code_within(&mut child, "Ctrl-C did not end the watch");
    assert_eq!(code, Some(0));
    assert!(
        interrupted.elapsed() < Duration::from_secs(3),
        "ended {:?} after Ctrl-C",
        interrupted.elapsed()
    );
}

// `status --watch --from` ends at Ctrl-C while a scrape waits on a gateway that does not
// answer: before, it waited out the scrape's 5 s first.
#[test]
fn status_watch_ends_at_ctrl_c_while_a_scrape_waits() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/metrics", silent.local_addr().expect("addr"));
    let child = Command::new(harness_exe())
        .args(["status", "--watch", "--from", &url])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // The first scrape is under way: its connection is taken and never answered.
    let (_held, _) = silent.accept().expect("the scrape connects");
    std::thread::sleep(Duration::from_millis(300));
    let interrupted = std::time::Instant::now();
    send_signal("-INT", &child.id().to_string());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        interrupted.elapsed() < Duration::from_secs(3),
        "ended {:?} after Ctrl-C",
        interrupted.elapsed()
    );
}
