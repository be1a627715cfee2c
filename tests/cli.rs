//! The built `mcp-harness` binary: `tools`, `call`, `status` and `demo` against the demo
//! servers over stdio and HTTP in both eras, config files, and exit codes.

mod support;

use std::process::{Command, Output};

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

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("mcp-harness-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write");
    path
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
    let o = Command::new(harness_exe())
        .args(["status", "--config", "examples/harness.toml"])
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

#[test]
fn ctrl_c_stops_every_server_and_exits() {
    let pidfile = std::env::temp_dir().join(format!(
        "mcp-harness-cli-{}-ctrlc.jsonl",
        std::process::id()
    ));
    let server = demo_cmd(&format!("alpha --record {}", pidfile.display()));
    let child = Command::new(harness_exe())
        .args(["call", "--stdio", &server, "hang"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait until the call reached the server, then interrupt the program.
    let start = std::time::Instant::now();
    while !recorded(&pidfile)
        .iter()
        .any(|r| r["params"]["name"] == "hang")
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the call never reached the server"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The server was a child of the program, in its own process group; none is left.
    let ours: Vec<u32> = std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.contains(&pidfile.display().to_string()))
        })
        .filter(|pid| alive(*pid))
        .collect();
    assert!(ours.is_empty(), "server processes left: {ours:?}");
    let _ = std::fs::remove_file(pidfile);
}
