//! One container lifecycle through the client, as the node helper will do it:
//! connect (ping + version check), create by full image ID (after inspecting
//! the image), start, stop with a grace period, delete.
//!
//! `start_stop SOCKET sha256:<64 hex> NAME`
//!
//! Used by `integration/bench/podman-start-stop.sh` to time whole processes.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use gpuq_podman::{lease_labels, ContainerSpec, ImageId, LibpodClient, Namespace, Podman, Role};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, image, name] = args.as_slice() else {
        eprintln!("usage: start_stop SOCKET sha256:<64 hex> NAME");
        return ExitCode::from(2);
    };
    match run(socket, image, name).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("start_stop: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(socket: &str, image: &str, name: &str) -> gpuq_podman::Result<()> {
    let t0 = Instant::now();
    let mut steps = Vec::new();
    let mut lap = |name: &'static str| steps.push((name, t0.elapsed()));
    let image = ImageId::parse(image)?;
    let podman = LibpodClient::connect(socket).await?;
    lap("connect");
    let mut spec = ContainerSpec::new(name, image);
    // Exits on SIGTERM, so the stop measures Podman, not a grace period.
    spec.command = vec![
        "sh".into(),
        "-c".into(),
        "trap 'exit 0' TERM; sleep 1000 & wait".into(),
    ];
    spec.labels = lease_labels("bench", Role::Server);
    spec.network = Namespace::Host;
    let id = podman.container_create(&spec).await?;
    lap("create");
    podman.container_start(&id).await?;
    lap("start");
    podman.container_stop(&id, Duration::from_secs(10)).await?;
    lap("stop");
    podman.container_delete(&id, true).await?;
    lap("delete");
    // Cumulative milliseconds since the process's runtime started.
    let line: Vec<String> = steps
        .iter()
        .map(|(n, d)| format!("{n}={:.1}", d.as_secs_f64() * 1e3))
        .collect();
    println!("{}", line.join(" "));
    Ok(())
}
