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
    let secret = [("MCP_TEST_SECRET", "hunter2")];
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
