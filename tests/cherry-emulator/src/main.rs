//! `cherry-emulator`: serve the emulated Cherry Servers API on 127.0.0.1 until killed, for the
//! real-node scenarios (the scaler's pod creates its machines here). Prints the base URL, then
//! one line per server created: `created ID HOSTNAME`.
//!
//! `cherry-emulator --token-file FILE --project ID --plan SLUG:CORES:MEMORY_GB`: the API token
//! is read from FILE (never from argv).

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use cherry_emulator::{CherryEmulator, Options, PlanSpec};

const USAGE: &str =
    "usage: cherry-emulator --token-file FILE --project ID --plan SLUG:CORES:MEMORY_GB";

fn options() -> Result<Options, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> Result<&str, String> {
        let at = args
            .iter()
            .position(|a| a == flag)
            .ok_or(format!("{flag} is missing; {USAGE}"))?;
        args.get(at + 1)
            .map(String::as_str)
            .ok_or(format!("{flag} needs a value; {USAGE}"))
    };
    let path = value("--token-file")?;
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("--token-file {path}: {e}"))?
        .trim()
        .to_string();
    let project = value("--project")?;
    let project_id = project
        .parse()
        .map_err(|_| format!("--project {project:?}: expected a number"))?;
    let plan = value("--plan")?;
    let bad = || format!("--plan {plan:?}: expected SLUG:CORES:MEMORY_GB");
    let mut parts = plan.split(':');
    let (Some(slug), Some(cores), Some(memory), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    Ok(Options {
        token,
        project_id,
        plans: vec![PlanSpec {
            slug: slug.to_string(),
            cores: cores.parse().map_err(|_| bad())?,
            memory_gb: memory.parse().map_err(|_| bad())?,
        }],
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let opts = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cherry-emulator: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let emu = match CherryEmulator::start(opts).await {
        Ok(emu) => emu,
        Err(e) => {
            eprintln!("cherry-emulator: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", emu.url());
    let _ = out.flush();
    let mut seen = BTreeSet::new();
    loop {
        for s in emu.servers() {
            let id = s["id"].as_u64().unwrap_or_default();
            if seen.insert(id) {
                let _ = writeln!(out, "created {id} {}", s["hostname"].as_str().unwrap_or(""));
                let _ = out.flush();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
