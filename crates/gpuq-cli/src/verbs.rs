//! One function per verb: build the request, call the broker, render.

use crate::{render, Exit, Verb};
use gpuq_client::{Client, ClientError};
use gpuq_protocol::{
    routes, JobList, JobView, LockInfo, LockRequest, SubmitRequest, SubmitResponse,
};
use hyper::Method;
use std::path::PathBuf;

/// `$GPUQ_SOCKET`, else `[broker] socket` from the config, else the default.
pub fn socket_path() -> PathBuf {
    if let Some(s) = std::env::var_os("GPUQ_SOCKET") {
        return PathBuf::from(s);
    }
    let cfg = std::env::var_os("GPUQ_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/gpuqueue-daos/broker.toml"));
    std::fs::read_to_string(cfg)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("broker")?.get("socket")?.as_str().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/run/gpuq/broker.sock"))
}

fn print_json<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub async fn run(client: &Client, verb: Verb) -> Result<i32, ClientError> {
    match verb {
        Verb::Submit {
            time,
            name,
            inst,
            stor,
            json,
            command,
        } => {
            let cwd = std::env::current_dir().map_err(|e| ClientError::Protocol {
                socket: client.socket().to_path_buf(),
                what: format!("cannot determine the current directory: {e}"),
            })?;
            // Variables that are not valid UTF-8 cannot travel in JSON; they are left out.
            let env: Vec<(String, String)> = std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect();
            let req = SubmitRequest {
                argv: command,
                cwd: cwd.display().to_string(),
                env,
                time,
                name,
                inst,
                stor,
            };
            let resp: SubmitResponse = client.call(Method::POST, routes::JOBS, Some(&req)).await?;
            if json {
                print_json(&resp);
            } else {
                println!("{}", resp.id);
                eprintln!(
                    "gpuq: job {} queued ({} ahead); output: {}",
                    resp.id, resp.position, resp.log_path
                );
            }
        }
        Verb::List { all, json } => {
            let path = if all {
                format!("{}?all=1", routes::JOBS)
            } else {
                routes::JOBS.to_string()
            };
            let list: JobList = client.call(Method::GET, &path, None::<&()>).await?;
            if json {
                print_json(&list);
            } else {
                print!("{}", render::list(&list, crate_now()));
            }
        }
        Verb::Status { job, json } => {
            let v: JobView = client
                .call(Method::GET, &format!("{}/{job}", routes::JOBS), None::<&()>)
                .await?;
            if json {
                print_json(&v);
            } else {
                print!("{}", render::job(&v, crate_now()));
            }
        }
        Verb::Log { job } => {
            let mut out = std::io::stdout().lock();
            client
                .stream_to(&format!("{}/{job}/log", routes::JOBS), &mut out)
                .await?;
        }
        Verb::Follow { job } => {
            {
                let mut out = std::io::stdout().lock();
                client
                    .stream_to(&format!("{}/{job}/log?follow=1", routes::JOBS), &mut out)
                    .await?;
            }
            let v: JobView = client
                .call(Method::GET, &format!("{}/{job}", routes::JOBS), None::<&()>)
                .await?;
            return Ok(v.follow_exit_code());
        }
        Verb::Cancel { job, json } => {
            let v: JobView = client
                .call(
                    Method::POST,
                    &format!("{}/{job}/cancel", routes::JOBS),
                    None::<&()>,
                )
                .await?;
            if json {
                print_json(&v);
            } else {
                eprintln!("gpuq: job {} {}", v.id, v.state);
            }
        }
        Verb::Lock { reason, json } => {
            let l: LockInfo = client
                .call(Method::POST, routes::LOCK, Some(&LockRequest { reason }))
                .await?;
            if json {
                print_json(&l);
            } else {
                eprintln!("gpuq: queue locked: {}", l.reason);
            }
        }
        Verb::Unlock { json } => {
            let old: Option<LockInfo> = client
                .call(Method::DELETE, routes::LOCK, None::<&()>)
                .await?;
            if json {
                print_json(&old);
            } else if old.is_some() {
                eprintln!(
                    "gpuq: queue unlocked (a recovery hold, if any, stays until `gpuq recover`)"
                );
            } else {
                eprintln!("gpuq: the queue was not locked");
            }
        }
        Verb::Recover { json } => {
            let v: serde_json::Value = client
                .call(Method::POST, routes::RECOVER, None::<&()>)
                .await?;
            if json {
                print_json(&v);
            } else {
                eprintln!("gpuq: {}", v["message"].as_str().unwrap_or("recovered"));
            }
        }
        Verb::DaosExec {
            workdir,
            env,
            command,
        } => return crate::exec::run(client, workdir, env, command).await,
        Verb::E2e {
            pool_size_from: Some(file),
            ..
        } => return Ok(crate::e2e::print_pool_size(&file)),
        Verb::E2e {
            profile,
            repeat,
            lease,
            json,
            pool_size_from: None,
        } => return crate::e2e::run(client, profile, repeat, lease, json).await,
        Verb::VerifyPins { json } => {
            let v: serde_json::Value = client.call(Method::GET, routes::PINS, None::<&()>).await?;
            if json {
                print_json(&v);
            } else {
                print!("{}", crate::render::pins(&v));
            }
            if v["ok"] != true {
                return Ok(Exit::Refused as i32);
            }
        }
        Verb::Stats { since, until, json } => {
            let mut q = Vec::new();
            if let Some(s) = since {
                q.push(format!("since={s}"));
            }
            if let Some(u) = until {
                // The last day is included: up to the next day's start.
                q.push(format!("until={}", u + 86_400));
            }
            let path = if q.is_empty() {
                routes::USAGE.to_string()
            } else {
                format!("{}?{}", routes::USAGE, q.join("&"))
            };
            let report: gpuq_protocol::UsageReport =
                client.call(Method::GET, &path, None::<&()>).await?;
            if json {
                print_json(&report);
            } else {
                print!("{}", render::usage(&report));
            }
        }
        Verb::VerifyInstall { json } => {
            let report: gpuq_manifest::report::InstallReport = client
                .call(Method::GET, routes::INSTALL, None::<&()>)
                .await?;
            let this_host = report
                .hosts
                .first()
                .map(|h| h.host.clone())
                .unwrap_or_default();
            let extra = crate::render::path_shadow(&this_host).into_iter().collect();
            let verdict =
                gpuq_manifest::report::assess(env!("CARGO_PKG_VERSION"), &report.hosts, extra);
            if json {
                print_json(&serde_json::json!({
                    "ok": verdict.ok,
                    "cli_version": verdict.cli_version,
                    "findings": verdict.findings,
                    "hosts": verdict.hosts,
                    "report": report,
                }));
            } else {
                print!("{}", crate::render::install(&verdict));
            }
            if !verdict.ok {
                return Ok(Exit::Refused as i32);
            }
        }
        Verb::Activate {
            json,
            execute: true,
            destroy_existing_data,
        } => {
            if !destroy_existing_data {
                eprintln!("gpuq: --execute destroys everything on the storage nodes' allowlisted devices: add --destroy-existing-data to agree (read the plan first: `sudo gpuq activate`); nothing was changed");
                return Ok(Exit::Usage as i32);
            }
            let req = gpuq_protocol::node::ActivateRequest {
                destroy_existing_data,
            };
            let done: gpuq_protocol::node::SiteActivation = client
                .call(Method::POST, routes::ACTIVATE, Some(&req))
                .await?;
            if json {
                print_json(&done);
            } else {
                print!("{}", crate::render::activation(&done));
            }
            if done.held.is_some() {
                return Ok(Exit::Refused as i32);
            }
        }
        Verb::Activate {
            destroy_existing_data: true,
            ..
        } => {
            eprintln!("gpuq: --destroy-existing-data goes with --execute; without it `gpuq activate` only plans and changes nothing");
            return Ok(Exit::Usage as i32);
        }
        Verb::Activate { json, .. } => {
            let plan: gpuq_protocol::node::SitePlan = client
                .call(Method::GET, routes::ACTIVATE, None::<&()>)
                .await?;
            if json {
                print_json(&plan);
            } else {
                print!("{}", crate::render::activation_plan(&plan));
            }
            if !plan.refusals().is_empty() {
                return Ok(Exit::Refused as i32);
            }
        }
        Verb::DaosStatus {
            json,
            lease: Some(lease),
            tail,
        } => {
            let v: Vec<gpuq_protocol::node::NodeOutput> = client
                .call(
                    Method::GET,
                    &format!("{}/{lease}?tail={tail}", routes::OUTPUT),
                    None::<&()>,
                )
                .await?;
            if json {
                print_json(&v);
            } else {
                print!("{}", crate::render::server_output(&v));
            }
            if v.iter().any(|n| n.error.is_some()) {
                return Ok(Exit::Refused as i32);
            }
        }
        Verb::DaosStatus { json, .. } => {
            let v: serde_json::Value = client.call(Method::GET, routes::DAOS, None::<&()>).await?;
            if json {
                print_json(&v);
            } else {
                print!("{}", crate::render::daos_status(&v));
            }
            let bad = v["hold"].is_object()
                || v["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|n| !n["error"].is_null()));
            if bad {
                return Ok(Exit::Refused as i32);
            }
        }
    }
    Ok(Exit::Ok as i32)
}

fn crate_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
