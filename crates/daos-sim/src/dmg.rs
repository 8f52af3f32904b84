//! `dmg`: the admin tool. Supports `system query`, `storage format`,
//! `system stop [--force]` and `pool create LABEL --size=N [--nranks=K]
//! [--nsvc=R]`, with `-o CONFIG`, `-i` (insecure), `-j` (JSON), `-l HOSTS`.
//!
//! With `-j` it prints dmg's envelope `{"response":…,"error":…,"status":…}`
//! on stdout on success and failure alike and exits 1 on failure
//! (src/control/common/cmdutil/json.go). Without `-j` it prints a short
//! human table.
//!
//! `storage format` goes to every host of the hostlist in parallel, as real
//! dmg does; the other commands go to the first host that answers, which
//! forwards them to the management service.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{resolve, ControlConfig};
use crate::error::SimError;
use crate::model::{
    compress_hosts, compress_ranks, fnv64, parse_size, DmgResponse, Envelope, HostErrorSet,
    HostStorage, HostStorageSet, PoolCreateResp, StorageFormatResp, StorageUsageResp,
    SystemQueryResp, SystemStopResp, UsageHostSet,
};
use crate::proto::{call, Request, Wire};
use crate::tls::{Role, Transport};

pub const USAGE: &str = "Usage:
  dmg [OPTIONS] <command>

daos-sim: DAOS control-plane simulator for tests; not DAOS.

Application Options:
  -o, --config-path=  Client config file path (default /etc/daos/daos_control.yml)
  -l, --host-list=    A comma separated list of addresses <ipv4addr/hostname>
  -i, --insecure      Have dmg attempt to connect without certificates
  -j, --json          Enable JSON output
  -h, --help          Show this help message

Available commands:
  system query
  system stop [--force]
  storage format [--force]
  storage query usage
  pool create LABEL --size=N [--nranks=K] [--nsvc=R]
";

/// Command-line words split into flags (`--k=v`, `--k v`, `-k v`) and
/// positionals. `valued` lists the flags that take a value.
#[derive(Debug, Default)]
pub struct Args {
    pub flags: BTreeMap<String, String>,
    pub pos: Vec<String>,
}

impl Args {
    pub fn parse(argv: &[String], valued: &[&str]) -> Result<Self, SimError> {
        let mut a = Args::default();
        let mut it = argv.iter();
        while let Some(w) = it.next() {
            if let Some(name) = w
                .strip_prefix("--")
                .or_else(|| w.strip_prefix('-').filter(|n| !n.is_empty()))
            {
                let (name, inline) = match name.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (name, None),
                };
                // Bundled short flags: -ij
                if !w.starts_with("--")
                    && name.len() > 1
                    && inline.is_none()
                    && !valued.contains(&name)
                {
                    for c in name.chars() {
                        a.flags.insert(c.to_string(), String::new());
                    }
                    continue;
                }
                let value = if valued.contains(&name) {
                    match inline {
                        Some(v) => v,
                        None => it.next().cloned().ok_or_else(|| {
                            SimError::Usage(format!("expected argument for flag `{w}'"))
                        })?,
                    }
                } else {
                    inline.unwrap_or_default()
                };
                a.flags.insert(name.to_string(), value);
            } else {
                a.pos.push(w.clone());
            }
        }
        Ok(a)
    }

    pub fn has(&self, names: &[&str]) -> bool {
        names.iter().any(|n| self.flags.contains_key(*n))
    }

    pub fn get(&self, names: &[&str]) -> Option<&str> {
        names
            .iter()
            .find_map(|n| self.flags.get(*n).map(String::as_str))
    }
}

const VALUED: &[&str] = &[
    "o",
    "config-path",
    "l",
    "host-list",
    "size",
    "z",
    "nranks",
    "nsvc",
    "s",
    "r",
];

#[derive(Debug)]
enum Cmd {
    SystemQuery,
    SystemStop {
        force: bool,
    },
    StorageFormat,
    StorageQueryUsage,
    PoolCreate {
        label: String,
        size: u64,
        nranks: Option<u32>,
        nsvc: Option<u32>,
    },
}

/// Runs dmg; returns the exit code.
pub fn main(argv: &[String]) -> i32 {
    let args = match Args::parse(argv, VALUED) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ERROR: dmg: {e}");
            return 1;
        }
    };
    if args.has(&["h", "help"]) || args.pos.is_empty() {
        print!("{USAGE}");
        return if args.pos.is_empty() && !args.has(&["h", "help"]) {
            1
        } else {
            0
        };
    }
    let json = args.has(&["j", "json"]);
    let result = command(&args).and_then(|(cmd, cfg, insecure)| run(cmd, &cfg, insecure));
    match result {
        Ok((value, human)) => {
            if json {
                print_envelope(Some(value), None);
            } else {
                print!("{human}");
            }
            0
        }
        Err(e) => {
            if json {
                print_envelope(None, Some(&e));
            } else {
                eprintln!("ERROR: dmg: {e}");
            }
            1
        }
    }
}

/// Prints dmg's JSON envelope on stdout.
pub fn print_envelope(response: Option<DmgResponse>, err: Option<&SimError>) {
    let env = Envelope {
        response,
        error: err.map(|e| e.to_string()),
        status: err.map(SimError::status).unwrap_or(0),
    };
    println!("{}", serde_json::to_string_pretty(&env).unwrap_or_default());
}

fn command(args: &Args) -> Result<(Cmd, ControlConfig, bool), SimError> {
    let mut cfg = match args.get(&["o", "config-path"]) {
        Some(p) => ControlConfig::load(&PathBuf::from(p))?,
        None => {
            let default = PathBuf::from("/etc/daos/daos_control.yml");
            if default.exists() {
                ControlConfig::load(&default)?
            } else {
                ControlConfig::default()
            }
        }
    };
    if let Some(l) = args.get(&["l", "host-list"]) {
        cfg.hostlist = l.split(',').map(str::to_string).collect();
    }
    let insecure = args.has(&["i", "insecure"]) || cfg.transport_config.allow_insecure;
    let words: Vec<&str> = args.pos.iter().map(String::as_str).collect();
    let num = |names: &[&str]| -> Result<Option<u32>, SimError> {
        args.get(names)
            .map(|v| {
                v.parse::<u32>()
                    .map_err(|_| SimError::Usage(format!("invalid --{} value {v:?}", names[0])))
            })
            .transpose()
    };
    let cmd = match words.as_slice() {
        ["system", "query"] => Cmd::SystemQuery,
        ["system", "stop"] => Cmd::SystemStop {
            force: args.has(&["force"]),
        },
        ["storage", "format"] => Cmd::StorageFormat,
        ["storage", "query", "usage"] => Cmd::StorageQueryUsage,
        ["pool", "create", label] => {
            let size = args
                .get(&["size", "z"])
                .ok_or_else(|| SimError::Usage("pool create: --size is required".into()))?;
            Cmd::PoolCreate {
                label: label.to_string(),
                size: parse_size(size).ok_or_else(|| SimError::Usage(format!("invalid --size {size:?}")))?,
                nranks: num(&["nranks"])?,
                nsvc: num(&["nsvc"])?,
            }
        }
        ["pool", "create"] => return Err(SimError::Usage("pool create: a LABEL is required".into())),
        other => {
            return Err(SimError::Usage(format!(
                "unknown command {:?} (daos-sim supports: system query, system stop, storage format, storage query usage, pool create)",
                other.join(" ")
            )))
        }
    };
    Ok((cmd, cfg, insecure))
}

/// Host names as dmg shows them: with the port.
fn with_port(host: &str, port: u16) -> String {
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

/// Sends a system-level request to the first host that answers.
pub fn system_call(
    cfg_hosts: &[String],
    port: u16,
    wire: &Wire,
    timeout: Duration,
    tp: &Transport,
) -> Result<serde_json::Value, SimError> {
    let mut last = SimError::Usage("empty hostlist".into());
    for h in cfg_hosts {
        let addr = match resolve(h, port) {
            Ok(a) => a,
            Err(e) => {
                last = e;
                continue;
            }
        };
        match call(addr, wire, timeout, tp) {
            Err(e @ SimError::Io { .. }) => last = e,
            other => return other,
        }
    }
    Err(last)
}

fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, SimError> {
    serde_json::from_value(v).map_err(|e| SimError::Protocol {
        peer: "server".into(),
        msg: e.to_string(),
    })
}

/// `w` to every host of the hostlist at once, as dmg sends storage
/// requests: each host's name (with the port) and its answer.
fn on_every_host(
    cfg: &ControlConfig,
    tp: &Transport,
    w: &Wire,
    timeout: Duration,
) -> Vec<(String, Result<serde_json::Value, SimError>)> {
    let handles: Vec<_> = cfg
        .hostlist
        .iter()
        .map(|h| {
            let name = with_port(h, cfg.port);
            let (h, port, tp, w) = (h.clone(), cfg.port, tp.clone(), w.clone());
            let thread_name = name.clone();
            (
                thread_name,
                std::thread::spawn(move || {
                    resolve(&h, port).and_then(|a| call(a, &w, timeout, &tp))
                }),
            )
        })
        .collect();
    handles
        .into_iter()
        .map(|(name, h)| {
            let r = h.join().unwrap_or_else(|_| {
                Err(SimError::Protocol {
                    peer: name.clone(),
                    msg: "request thread panicked".into(),
                })
            });
            (name, r)
        })
        .collect()
}

fn run(cmd: Cmd, cfg: &ControlConfig, insecure: bool) -> Result<(DmgResponse, String), SimError> {
    // Without -i or allow_insecure, dmg presents the admin certificate
    // named in its config (DAOS defaults under /etc/daos/certs).
    let tp = if insecure {
        Transport::Insecure
    } else {
        Transport::load(&cfg.transport_config, Role::Admin)?
    };
    let tp = &tp;
    let wire = |req| Wire {
        req,
        system: cfg.name.clone(),
        insecure,
    };
    let long = Duration::from_secs(120);
    match cmd {
        Cmd::SystemQuery => {
            let v = system_call(
                &cfg.hostlist,
                cfg.port,
                &wire(Request::SystemQuery),
                long,
                tp,
            )?;
            let resp: SystemQueryResp = decode(v)?;
            let mut by_state: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            for m in &resp.members {
                by_state.entry(m.state.clone()).or_default().push(m.rank);
            }
            let mut human = String::from("Rank  State\n----  -----\n");
            for (state, ranks) in by_state {
                let mut st = state.clone();
                if let Some(f) = st.get_mut(0..1) {
                    f.make_ascii_uppercase();
                }
                human.push_str(&format!("{:<5} {st}\n", compress_ranks(&ranks)));
            }
            Ok((DmgResponse::SystemQuery(resp), human))
        }
        Cmd::SystemStop { force } => {
            let v = system_call(
                &cfg.hostlist,
                cfg.port,
                &wire(Request::SystemStop { force }),
                long,
                tp,
            )?;
            let resp: SystemStopResp = decode(v)?;
            let mut human = String::from("Rank  Operation Result\n----  --------- ------\n");
            for r in &resp.results {
                let res = if r.errored { r.msg.as_str() } else { "OK" };
                human.push_str(&format!("{:<5} {:<9} {res}\n", r.rank, r.action));
            }
            Ok((DmgResponse::SystemStop(resp), human))
        }
        Cmd::PoolCreate {
            label,
            size,
            nranks,
            nsvc,
        } => {
            let req = Request::PoolCreate {
                label,
                size,
                nranks,
                nsvc,
            };
            let v = system_call(&cfg.hostlist, cfg.port, &wire(req), long, tp)?;
            let r: PoolCreateResp = decode(v)?;
            let human = format!(
                "Pool created with 6.00%,94.00% storage tier ratio\n\
                 --------------------------------------------------\n\
                 \x20 UUID                 : {}\n\
                 \x20 Service Leader       : {}\n\
                 \x20 Service Ranks        : {}\n\
                 \x20 Storage Ranks        : {}\n\
                 \x20 Total Size           : {} B\n",
                r.uuid,
                r.svc_ldr,
                compress_ranks(&r.svc_reps),
                compress_ranks(&r.tgt_ranks),
                r.tier_bytes.iter().sum::<u64>() * r.tgt_ranks.len() as u64
            );
            Ok((DmgResponse::PoolCreate(r), human))
        }
        Cmd::StorageQueryUsage => {
            let answers = on_every_host(
                cfg,
                tp,
                &wire(Request::StorageUsage),
                Duration::from_secs(30),
            );
            let mut resp = StorageUsageResp::default();
            let mut human = String::from(
                "Hosts SCM-Total SCM-Free NVMe-Total NVMe-Free\n----- --------- -------- ---------- ---------\n",
            );
            for (name, answer) in answers {
                match answer {
                    Ok(storage) => {
                        let sum = |list: &str, f: &dyn Fn(&serde_json::Value) -> u64| {
                            storage[list]
                                .as_array()
                                .map(|a| a.iter().map(f).sum::<u64>())
                                .unwrap_or(0)
                        };
                        let field = |k: &'static str| {
                            move |v: &serde_json::Value| v[k].as_u64().unwrap_or(0)
                        };
                        let smd = |k: &'static str| {
                            move |c: &serde_json::Value| {
                                c["smd_devices"]
                                    .as_array()
                                    .map(|d| d.iter().map(|s| s[k].as_u64().unwrap_or(0)).sum())
                                    .unwrap_or(0)
                            }
                        };
                        human.push_str(&format!(
                            "{name} {} {} {} {}\n",
                            sum("scm_mount_points", &field("total_bytes")),
                            sum("scm_mount_points", &field("avail_bytes")),
                            sum("nvme_devices", &smd("total_bytes")),
                            sum("nvme_devices", &smd("avail_bytes")),
                        ));
                        resp.host_storage.insert(
                            fnv64(&name).to_string(),
                            UsageHostSet {
                                hosts: name,
                                storage,
                            },
                        );
                    }
                    Err(e) => {
                        let error = e.to_string();
                        human.push_str(&format!("Errors:\n  {name}: {error}\n"));
                        resp.host_errors.insert(
                            fnv64(&format!("{name}{error}")).to_string(),
                            HostErrorSet { hosts: name, error },
                        );
                    }
                }
            }
            Ok((DmgResponse::StorageUsage(resp), human))
        }
        Cmd::StorageFormat => {
            let mut ok: Vec<(String, HostStorage)> = Vec::new();
            let mut errs: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (name, answer) in
                on_every_host(cfg, tp, &wire(Request::Format), Duration::from_secs(60))
            {
                match answer.and_then(decode::<HostStorage>) {
                    Ok(s) => ok.push((name, s)),
                    Err(e) => errs.entry(e.to_string()).or_default().push(name),
                }
            }
            let mut resp = StorageFormatResp::default();
            let mut groups: Vec<(HostStorage, Vec<String>)> = Vec::new();
            for (name, s) in ok {
                match groups.iter_mut().find(|(g, _)| *g == s) {
                    Some((_, hosts)) => hosts.push(name),
                    None => groups.push((s, vec![name])),
                }
            }
            let mut human = String::from("Format Summary:\n  Hosts SCM Devices NVMe Devices\n  ----- ----------- ------------\n");
            for (storage, hosts) in groups {
                let key = fnv64(&serde_json::to_string(&storage).unwrap_or_default()).to_string();
                human.push_str(&format!(
                    "  {} {} {}\n",
                    compress_hosts(&hosts),
                    storage.scm_mount_points.len(),
                    storage.nvme_devices.len()
                ));
                resp.host_storage.insert(
                    key,
                    HostStorageSet {
                        hosts: compress_hosts(&hosts),
                        storage,
                    },
                );
            }
            for (error, hosts) in errs {
                human.push_str(&format!("Errors:\n  {}: {error}\n", compress_hosts(&hosts)));
                resp.host_errors.insert(
                    fnv64(&error).to_string(),
                    HostErrorSet {
                        hosts: compress_hosts(&hosts),
                        error,
                    },
                );
            }
            Ok((DmgResponse::StorageFormat(resp), human))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn args_split_flags_and_positionals() {
        let a = Args::parse(
            &s(&[
                "-o",
                "c.yml",
                "-ij",
                "pool",
                "create",
                "p1",
                "--size=10G",
                "--nranks",
                "4",
            ]),
            VALUED,
        )
        .unwrap();
        assert_eq!(a.get(&["o"]), Some("c.yml"));
        assert!(a.has(&["i"]) && a.has(&["j"]));
        assert_eq!(a.pos, ["pool", "create", "p1"]);
        assert_eq!(a.get(&["size"]), Some("10G"));
        assert_eq!(a.get(&["nranks"]), Some("4"));
        assert!(Args::parse(&s(&["-o"]), VALUED).is_err());
    }
}
