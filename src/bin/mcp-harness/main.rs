//! The `mcp-harness` command-line program.
//!
//! `main` parses arguments, sets up logging (RUST_LOG, on stderr), runs the command and
//! turns its outcome into an exit code: 0 success, 2 usage or configuration errors.

mod demo;
mod demo_server;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run many MCP servers at once, supervised.
#[derive(Parser)]
#[command(name = "mcp-harness", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Walk through what the harness does, against MCP servers that ship inside this
    /// binary (stdio and loopback HTTP, both protocol eras). Needs no network.
    Demo,
    /// Act as a demo MCP server (for the demo, the tests and the benchmarks).
    DemoServer(demo_server::DemoServerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcp-harness: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Demo => demo::run().await,
            Command::DemoServer(args) => demo_server::run(args).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcp-harness: {e:#}");
            ExitCode::from(1)
        }
    }
}
