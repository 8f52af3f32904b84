//! What a submit must be before anything is stored: pure checks of the
//! request against the configuration, each refusal one line saying what
//! was wrong and what to do. The broker then applies what depends on its
//! state (the maintenance lock, the per-user queue cap) and stores the job.

use crate::config::BrokerConfig;
use crate::error::ApiError;
use gpuq_protocol::node::{StorKernel, StorKind, Support};
use gpuq_protocol::{duration, SubmitRequest};

/// What each storage node's kernel offers `--stor` jobs (its helper's
/// status; `Err` says why a node has no answer), asked for a `--stor`
/// submit only.
pub type StorNodes = [(String, Result<StorKernel, String>)];
/// Longest `--name`, in characters.
pub const MAX_NAME: usize = 64;

/// What `--inst` may name on this broker.
#[derive(Debug)]
pub enum Daos<'a> {
    /// No enabled `[daos]`: `--inst` is refused with the config's reason.
    Off(&'a BrokerConfig),
    /// The configured `[daos.profiles]` (for `--inst`) and `[daos.stor]`
    /// profiles with their kinds (for `--stor`).
    Profiles(Vec<String>, Vec<(String, StorKind)>),
}

/// Check `req`; the job's time limit in seconds if it may be stored.
/// `nfs_host`: whether this host can keep a `--stor nfsrdma` lease's
/// exports to the owner (asked for such a submit only:
/// [`gpuq_lifecycle::nfs::privileged_ports_hold`]).
pub fn check(
    req: &SubmitRequest,
    cfg: &BrokerConfig,
    daos: &Daos<'_>,
    stor_nodes: Option<&StorNodes>,
    nfs_host: &dyn Fn() -> Result<(), String>,
) -> Result<u64, ApiError> {
    let limit = fields(req, cfg)?;
    kinds(req, daos, stor_nodes, nfs_host)?;
    Ok(limit)
}

/// Everything but `--stor` and `--inst`: the command, directory,
/// environment, name and time limit; the limit in seconds.
pub fn fields(req: &SubmitRequest, cfg: &BrokerConfig) -> Result<u64, ApiError> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return bad("no command given: use `gpuq submit -- CMD [ARGS...]`".into());
    }
    let has_nul = |s: &str| s.contains('\0');
    if req.argv.iter().any(|a| has_nul(a))
        || has_nul(&req.cwd)
        || req.env.iter().any(|(k, v)| has_nul(k) || has_nul(v))
    {
        return bad("command, directory and environment must not contain NUL bytes".into());
    }
    // The same rule daos-exec applies when it mounts the directory
    // (exec_dirs.rs): absolute, no '..', at most 4095 bytes.
    if let Err(why) = crate::exec_dirs::plain_abs_path(&req.cwd) {
        return bad(format!(
            "working directory '{}' {why}",
            crate::exec_dirs::shown(&req.cwd)
        ));
    }
    if let Some(name) = &req.name {
        if name.is_empty() || name.chars().count() > MAX_NAME || name.chars().any(char::is_control)
        {
            return bad(format!("--name must be 1-{MAX_NAME} printable characters"));
        }
    }
    let limit = match &req.time {
        None => cfg.default_time_secs,
        Some(t) => duration::parse(t).map_err(|e| ApiError::BadRequest(e.to_string()))?,
    };
    if limit > cfg.max_time_secs {
        return bad(format!(
            "time limit {} is longer than this host's maximum {}",
            duration::format(limit),
            duration::format(cfg.max_time_secs)
        ));
    }
    Ok(limit)
}

/// `--stor` and `--inst` against what this broker serves.
fn kinds(
    req: &SubmitRequest,
    daos: &Daos<'_>,
    stor_nodes: Option<&StorNodes>,
    nfs_host: &dyn Fn() -> Result<(), String>,
) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    if let Some(name) = &req.stor {
        if req.inst.is_some() {
            return bad(
                "--inst and --stor cannot go together: a job has one kind of storage".into(),
            );
        }
        let profile = match daos {
            Daos::Profiles(_, stor) => stor.iter().find(|(n, _)| n == name).map(|(_, k)| *k),
            Daos::Off(_) => None,
        };
        let Some(kind) = profile.or_else(|| StorKind::parse(name)) else {
            return bad(format!(
                "--stor '{name}' is not a storage kind: use one of {}",
                StorKind::ALL.map(StorKind::name).join(", ")
            ));
        };
        if let Daos::Off(cfg) = daos {
            // Kernel storage is served by the same four nodes.
            return Err(ApiError::NotEnabled(
                cfg.daos_off(&format!("--stor {name}")),
            ));
        }
        // This host first: whatever the nodes offer, an export this host
        // cannot keep to the owner is not stood up. (Every kind decides
        // here: a new kind is a compile error until it does.)
        let host = match kind {
            StorKind::Nfsrdma => nfs_host(),
            StorKind::Nvmeof | StorKind::Lustre => Ok(()),
        };
        if let Err(why) = host {
            return Err(ApiError::NotEnabled(format!(
                "--stor {name}: {why}; meanwhile use --inst"
            )));
        }
        if let Some(why) = stor_nodes.and_then(|n| nodes_lacking(kind, n)) {
            return Err(ApiError::NotEnabled(format!(
                "--stor {name}: not every storage node can serve it ({why}); \
                 use --inst, or ask the operator for nodes whose kernel has it"
            )));
        }
        if profile.is_none() {
            return Err(ApiError::NotEnabled(format!(
                "kernel storage jobs (--stor {name}) are not enabled on this broker yet; use --inst"
            )));
        }
        if stor_nodes.is_none() {
            // The nodes must have been asked (the broker always does).
            return Err(ApiError::NotEnabled(format!(
                "--stor {name}: the storage nodes' kernels were not asked; try again"
            )));
        }
        return Ok(());
    }
    if let Some(inst) = &req.inst {
        match daos {
            Daos::Off(cfg) => {
                return Err(ApiError::NotEnabled(
                    cfg.daos_off(&format!("--inst {inst}")),
                ))
            }
            Daos::Profiles(p, _) if !p.contains(inst) => {
                return bad(format!(
                    "--inst '{inst}' is not a DAOS profile here; configured: {}",
                    p.join(", ")
                ))
            }
            Daos::Profiles(..) => {}
        }
    }
    Ok(())
}

/// The nodes that cannot serve `kind`, nodes with the same reason named
/// together (`da1, da2: kernel … has no lnet, …`); `None` when all can.
fn nodes_lacking(kind: StorKind, nodes: &StorNodes) -> Option<String> {
    let mut why: Vec<(String, Vec<&str>)> = Vec::new();
    for (node, r) in nodes {
        let reason = match r.as_ref().map(|k| k.support(kind)) {
            Err(e) => e.clone(),
            Ok(Support {
                available: true, ..
            }) => continue,
            Ok(Support { missing, .. }) => {
                missing.clone().unwrap_or_else(|| "not available".into())
            }
        };
        match why.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(node),
            None => why.push((reason, vec![node])),
        }
    }
    (!why.is_empty()).then(|| {
        why.iter()
            .map(|(reason, names)| format!("{}: {reason}", names.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg() -> BrokerConfig {
        BrokerConfig::parse(
            Path::new("/etc/gpuqueue-daos/broker.toml"),
            "[broker]\ndefault_time = \"1h\"\nmax_time = \"2h\"\n",
        )
        .unwrap()
    }

    fn req(argv: &[&str]) -> SubmitRequest {
        SubmitRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: "/home/alice".into(),
            env: vec![("PATH".into(), "/usr/bin".into())],
            time: None,
            name: None,
            inst: None,
            stor: None,
        }
    }

    /// A host that keeps NFS exports to their owner.
    fn fine() -> Result<(), String> {
        Ok(())
    }

    fn refused(r: Result<u64, ApiError>) -> (String, String) {
        let e = r.unwrap_err();
        let code = e.status_and_code().1.as_str().to_string();
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        (code, msg)
    }

    #[test]
    fn a_plain_request_gets_the_default_limit_or_its_own() {
        let c = cfg();
        let off = Daos::Off(&c);
        assert_eq!(check(&req(&["true"]), &c, &off, None, &fine).unwrap(), 3600);
        let mut r = req(&["true"]);
        r.time = Some("90m".into());
        assert_eq!(check(&r, &c, &off, None, &fine).unwrap(), 5400);
    }

    #[test]
    fn each_bad_field_is_refused_in_one_line_naming_it() {
        let c = cfg();
        let off = Daos::Off(&c);
        let cases: Vec<(SubmitRequest, &str, &str)> = vec![
            (req(&[]), "bad_request", "no command given"),
            (req(&[""]), "bad_request", "no command given"),
            (req(&["a\0b"]), "bad_request", "NUL"),
            (
                SubmitRequest {
                    env: vec![("X".into(), "a\0".into())],
                    ..req(&["true"])
                },
                "bad_request",
                "NUL",
            ),
            (
                SubmitRequest {
                    cwd: "relative/dir".into(),
                    ..req(&["true"])
                },
                "bad_request",
                "working directory 'relative/dir'",
            ),
            (
                SubmitRequest {
                    cwd: "/home/../etc".into(),
                    ..req(&["true"])
                },
                "bad_request",
                "working directory",
            ),
            (
                SubmitRequest {
                    name: Some(String::new()),
                    ..req(&["true"])
                },
                "bad_request",
                "--name must be 1-64",
            ),
            (
                SubmitRequest {
                    name: Some("x".repeat(65)),
                    ..req(&["true"])
                },
                "bad_request",
                "--name",
            ),
            (
                SubmitRequest {
                    name: Some("a\u{1b}[2J".into()),
                    ..req(&["true"])
                },
                "bad_request",
                "--name",
            ),
            (
                SubmitRequest {
                    time: Some("soon".into()),
                    ..req(&["true"])
                },
                "bad_request",
                "soon",
            ),
            (
                SubmitRequest {
                    time: Some("3h".into()),
                    ..req(&["true"])
                },
                "bad_request",
                "longer than this host's maximum 2:00:00",
            ),
            (
                SubmitRequest {
                    stor: Some("ext4".into()),
                    ..req(&["true"])
                },
                "bad_request",
                "use one of lustre, nfsrdma, nvmeof",
            ),
            (
                SubmitRequest {
                    stor: Some("lustre".into()),
                    ..req(&["true"])
                },
                "not_enabled",
                "--stor lustre",
            ),
            (
                SubmitRequest {
                    inst: Some("inst1".into()),
                    ..req(&["true"])
                },
                "not_enabled",
                "no [daos] in /etc/gpuqueue-daos/broker.toml",
            ),
        ];
        for (r, code, needle) in cases {
            let (c2, msg) = refused(check(&r, &c, &off, None, &fine));
            assert_eq!(c2, code, "{msg}");
            assert!(msg.contains(needle), "{needle:?} not in {msg:?}");
        }
    }

    #[test]
    fn inst_must_name_a_configured_profile() {
        let c = cfg();
        let p = Daos::Profiles(vec!["inst1".into(), "inst2".into()], vec![]);
        let mut r = req(&["true"]);
        r.inst = Some("inst2".into());
        assert!(check(&r, &c, &p, None, &fine).is_ok());
        r.inst = Some("inst3".into());
        let (code, msg) = refused(check(&r, &c, &p, None, &fine));
        assert_eq!(code, "bad_request");
        assert!(msg.contains("configured: inst1, inst2"), "{msg}");
    }

    #[test]
    fn stor_names_the_nodes_whose_kernel_lacks_the_kind_grouped_by_reason_and_stores_nothing() {
        let c = cfg();
        let p = Daos::Profiles(vec!["inst1".into()], vec![]);
        let yes = || Support {
            available: true,
            missing: None,
        };
        let no = |why: &str| Support {
            available: false,
            missing: Some(why.into()),
        };
        let kernel = |lustre: Support| StorKernel {
            release: "6.1.0".into(),
            nvmeof_target: yes(),
            nfs_server: yes(),
            lustre_server: lustre,
        };
        let nodes: Vec<(String, Result<StorKernel, String>)> = vec![
            ("da1".into(), Ok(kernel(no("kernel 6.1.0 has no lnet")))),
            ("da2".into(), Ok(kernel(yes()))),
            ("da3".into(), Ok(kernel(no("kernel 6.1.0 has no lnet")))),
            ("da4".into(), Err("not reachable: ssh: timed out".into())),
        ];
        let mut r = req(&["true"]);
        r.stor = Some("lustre".into());
        let (code, msg) = refused(check(&r, &c, &p, Some(&nodes), &fine));
        assert_eq!(code, "not_enabled");
        assert_eq!(
            msg,
            "--stor lustre: not every storage node can serve it (da1, da3: kernel 6.1.0 has no lnet; \
             da4: not reachable: ssh: timed out); use --inst, or ask the operator for nodes whose kernel has it"
        );
        // nvmeof: all four kernels have it but da4 did not answer.
        r.stor = Some("nvmeof".into());
        let (_, msg) = refused(check(&r, &c, &p, Some(&nodes), &fine));
        assert!(
            msg.contains("(da4: not reachable: ssh: timed out)"),
            "{msg}"
        );
        // Every node can, but the broker has no [daos.stor] profile for
        // it: refused in one line that says so.
        let all: Vec<_> = ["da1", "da2", "da3", "da4"]
            .iter()
            .map(|n| (n.to_string(), Ok(kernel(yes()))))
            .collect();
        let (code, msg) = refused(check(&r, &c, &p, Some(&all), &fine));
        assert_eq!(code, "not_enabled");
        assert!(msg.contains("not enabled on this broker yet"), "{msg}");
        // With the profile: accepted; with --inst too: refused.
        let with = Daos::Profiles(
            vec!["inst1".into()],
            vec![("nvmeof".into(), StorKind::Nvmeof)],
        );
        assert!(check(&r, &c, &with, Some(&all), &fine).is_ok());
        let (code, msg) = refused(check(&r, &c, &with, Some(&nodes), &fine));
        assert_eq!(code, "not_enabled", "{msg}");
        r.inst = Some("inst1".into());
        let (code, msg) = refused(check(&r, &c, &with, Some(&all), &fine));
        assert_eq!(code, "bad_request");
        assert!(msg.contains("cannot go together"), "{msg}");
        r.inst = None;
        // Without [daos] there are no nodes to ask: the config's reason.
        let (_, msg) = refused(check(&r, &c, &Daos::Off(&c), None, &fine));
        assert!(
            msg.contains("--stor nvmeof") && msg.contains("no [daos]"),
            "{msg}"
        );
    }

    #[test]
    fn stor_nfsrdma_is_refused_first_where_this_host_cannot_keep_the_export_to_its_owner() {
        let c = cfg();
        let p = Daos::Profiles(
            vec![],
            vec![
                ("nfs".into(), StorKind::Nfsrdma),
                ("nvme".into(), StorKind::Nvmeof),
            ],
        );
        let no_host = || Err("this host lets every user send from port 0 up".to_string());
        let asked = std::cell::Cell::new(0);
        let counted = || {
            asked.set(asked.get() + 1);
            no_host()
        };
        // Whatever the nodes said (here: none answered), the host's rule
        // is named first, in one line.
        let lost: Vec<(String, Result<StorKernel, String>)> =
            vec![("da1".into(), Err("not reachable".into()))];
        let mut r = req(&["true"]);
        r.stor = Some("nfs".into());
        let (code, msg) = refused(check(&r, &c, &p, Some(&lost), &counted));
        assert_eq!(code, "not_enabled");
        assert_eq!(
            msg,
            "--stor nfs: this host lets every user send from port 0 up; meanwhile use --inst"
        );
        // Another kind, or a job without --stor, never asks.
        r.stor = Some("nvme".into());
        let (_, msg) = refused(check(&r, &c, &p, Some(&lost), &counted));
        assert!(msg.contains("da1: not reachable"), "{msg}");
        assert!(check(&req(&["true"]), &c, &p, None, &counted).is_ok());
        assert_eq!(asked.get(), 1);
    }
}
