//! Tool search over a catalog of real MCP servers' tools: how often the tool a query
//! means is found first (recall@1) and among the first five (recall@5), what a search
//! costs, and how many tokens of tool definitions a client receives with the full list
//! against the gateway's search exposure.
//!
//! The catalog (`benches/tool_catalog`, see its SOURCES.md) holds the tool lists of 28
//! published servers; each is served by a real process (the demo server with
//! `--tools-file`), next to the demo server itself, all behind one harness. Tokens are
//! counted with tiktoken-rs's `o200k_base`, the BPE of current OpenAI models, over the
//! JSON a gateway sends: the `tools/list` result in full mode; the three meta-tools in
//! search mode, and for one task the meta-tools plus one search's result (5 tools) and
//! one `describe_tool` result. Prints `BENCH name value unit` lines, as the main bench.

use std::path::Path;
use std::time::{Duration, Instant};

use mcp_harness::gateway::search::{describe_result, meta_tools, search_result};
use mcp_harness::{Caller, Harness, HarnessConfig, HarnessHandle, ServerConfig, ServerState};
use serde_json::{Value, json};

fn harness_bin() -> String {
    env!("CARGO_BIN_EXE_mcp-harness").to_string()
}

fn servers(catalog: &Path) -> Vec<ServerConfig> {
    let mut files: Vec<_> = std::fs::read_dir(catalog.join("servers"))
        .expect("catalog")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out: Vec<ServerConfig> = files
        .iter()
        .map(|path| {
            let id = path.file_stem().and_then(|s| s.to_str()).expect("id");
            let args = vec![
                "demo-server".to_string(),
                id.to_string(),
                "--tools-file".to_string(),
                path.display().to_string(),
            ];
            ServerConfig::stdio(id, harness_bin(), args)
        })
        .collect();
    out.push(ServerConfig::stdio(
        "demo",
        harness_bin(),
        vec!["demo-server".to_string(), "demo".to_string()],
    ));
    out
}

async fn ready(h: &HarnessHandle) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if h.status().iter().all(|s| s.state == ServerState::Ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("servers not ready");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let catalog = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/tool_catalog");
    let queries: Vec<Value> =
        serde_json::from_slice(&std::fs::read(catalog.join("queries.json")).expect("queries"))
            .expect("queries json");
    let bpe = tiktoken_rs::o200k_base().expect("o200k_base");
    let tokens = |v: &Value| bpe.encode_ordinary(&v.to_string()).len();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut lines: Vec<(String, f64, &str)> = Vec::new();
    rt.block_on(async {
        let mut config = HarnessConfig {
            servers: servers(&catalog),
            ..HarnessConfig::default()
        };
        config
            .permissions
            .entry("bench".into())
            .or_default()
            .insert("*".into(), vec!["*".into()]);
        let h = Harness::spawn(config).await.expect("harness");
        ready(&h).await;
        let caller = Caller::agent("bench");
        let tools = h.list_tools(&caller).await.expect("list");
        lines.push(("search_catalog_tools".into(), tools.len() as f64, "tools"));
        lines.push((
            "search_catalog_queries".into(),
            queries.len() as f64,
            "queries",
        ));

        // The first search builds the index; later ones reuse it.
        let t = Instant::now();
        h.search_tools(&caller, "warm up", 5).await.expect("search");
        lines.push((
            "search_index_build".into(),
            t.elapsed().as_secs_f64() * 1e3,
            "ms",
        ));

        let (mut at1, mut at5) = (0usize, 0usize);
        let mut micros = Vec::new();
        let mut per_task = Vec::new();
        for q in &queries {
            let (Some(query), Some(expected)) = (q["query"].as_str(), q["expected"].as_str())
            else {
                panic!("bad query {q}");
            };
            let t = Instant::now();
            let found = h.search_tools(&caller, query, 5).await.expect("search");
            micros.push(t.elapsed().as_secs_f64() * 1e6);
            let rank = found.iter().position(|m| &*m.tool.qualified == expected);
            match rank {
                Some(0) => at1 += 1,
                Some(_) => {}
                None => eprintln!(
                    "missed {expected} <- {query:?}; found {:?}",
                    found
                        .iter()
                        .take(3)
                        .map(|m| &*m.tool.qualified)
                        .collect::<Vec<_>>()
                ),
            }
            at5 += usize::from(rank.is_some());
            // One task in search mode: the meta-tools, one search, one description.
            let named: Vec<(String, &Value)> = found
                .iter()
                .map(|m| (m.tool.qualified.to_string(), &*m.tool.definition))
                .collect();
            let described = found.first().map(|m| &*m.tool.definition);
            let top = found.first().map_or("", |m| &*m.tool.qualified);
            per_task.push(
                (tokens(&json!({"tools": meta_tools()}))
                    + tokens(&search_result(&named, 0))
                    + tokens(&describe_result(top, described))) as f64,
            );
        }
        let n = queries.len() as f64;
        lines.push(("search_recall_at_1".into(), at1 as f64 / n, "ratio"));
        lines.push(("search_recall_at_5".into(), at5 as f64 / n, "ratio"));
        lines.push(("search_p50".into(), median(micros), "us"));
        let t = Instant::now();
        for _ in 0..20 {
            h.list_tools(&caller).await.expect("list");
        }
        lines.push((
            "search_list_tools_p50_baseline".into(),
            t.elapsed().as_secs_f64() * 1e6 / 20.0,
            "us",
        ));

        let full: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut def = (*t.definition).clone();
                def["name"] = json!(&*t.qualified);
                def
            })
            .collect();
        let full_tokens = tokens(&json!({ "tools": full })) as f64;
        let meta_tokens = tokens(&json!({ "tools": meta_tools() })) as f64;
        let task_tokens = median(per_task);
        lines.push(("tokens_full_list".into(), full_tokens, "tokens"));
        lines.push(("tokens_search_list".into(), meta_tokens, "tokens"));
        lines.push(("tokens_search_task_p50".into(), task_tokens, "tokens"));
        lines.push((
            "tokens_saved_list".into(),
            1.0 - meta_tokens / full_tokens,
            "ratio",
        ));
        lines.push((
            "tokens_saved_task".into(),
            1.0 - task_tokens / full_tokens,
            "ratio",
        ));
        h.shutdown().await;
    });
    println!();
    for (name, value, unit) in lines {
        println!("BENCH {name} {value:.3} {unit}");
    }
}
