//! The systemd runner: one transient unit `gpuq-job-<id>.service` per job,
//! created with `StartTransientUnit` on systemd's D-Bus API (no
//! `systemd-run` subprocess). systemd gives the unit its own cgroup, so
//! `KillUnit(..., "all", SIGKILL)` ends the whole tree.
//!
//! The unit runs the user's command through `/bin/bash --posix -c 'exec "$@"'`
//! so that a command name is looked up in the user's own `PATH` (transient
//! units need an absolute `ExecStart`); bash because it passes environment
//! entries of any name on to the command, which dash (Debian's `/bin/sh`)
//! drops, and `--posix` because that is how EL's `/bin/sh` (bash) runs: no
//! `BASH_ENV` or other start-up file is read.
//!
//! **No path of the user's is handed to systemd as root.** The job's stdout
//! and stderr are the log file the broker already opened safely
//! (`joblog::create`: `O_NOFOLLOW`, fstat checks), passed with the D-Bus
//! message as `StandardOutputFileDescriptor`/`StandardErrorFileDescriptor`
//! (type `h`; `bus_set_transient_std_fd` in systemd's
//! `src/core/dbus-service.c`, what `systemd-run --pty` uses — older than
//! EL8's 239, but tested here on 252 only). The former `StandardOutputFileToAppend=<path>` made
//! systemd open the path as root when it spawned the job, following a
//! symlink the user had put there meanwhile (issue #13). `WorkingDirectory`
//! stays a path: systemd enters it after it has switched to the user
//! (execute.c: "Apply working directory here, because the working directory
//! might be on NFS and only the user running this service might have the
//! correct privilege"), so it reaches only what the user could `cd` to.
//!
//! **Environment.** systemd refuses a whole `Environment=` list with one
//! name outside `[A-Za-z_][A-Za-z0-9_]*` (`env_name_is_valid`), and EL8's 239
//! also values with control characters (`env_value_is_valid`); Lmod exports
//! `BASH_FUNC_module%%`. Such entries are given to the job by
//! `/usr/bin/env -- NAME=VALUE… /bin/bash …` in `ExecStart` instead, so that
//! the job gets exactly the environment it would get with the direct runner.
//!
//! `RemainAfterExit=yes` keeps the unit — and its
//! `ExecMainCode`/`ExecMainStatus` — after the main process ends, also while
//! the broker is restarting; the broker stops and resets it after reading
//! the status. `Type=exec` makes the start job fail when systemd cannot set
//! the job up (user, groups, working directory, log file): `start` waits for
//! that job's `JobRemoved` signal and reports such a failure as an error, not
//! as the job's exit code.
//!
//! **Tests:** `tests/tests/systemd_runner.rs` runs the real broker with this
//! runner against a real systemd (PID 1 of a Podman container, see
//! `integration/systemd-box/`), driven by the real CLI.

use super::{JobSpec, Outcome, Runner, RunnerError};
use async_trait::async_trait;
use gpuq_protocol::JobId;
use std::fs::File;
use std::os::fd::AsFd;
use std::time::Duration;
use zbus::zvariant::{Fd, OwnedObjectPath, OwnedValue, Value};

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// A unit's state is read again when systemd signals a change of it
/// (`PropertiesChanged`, sent once the broker has called `Subscribe`), and
/// at least this often in case a signal was lost (a bus or systemd
/// restart): a job's end is when the DAOS cleanup and the next job start.
const RECHECK: Duration = Duration::from_secs(5);
/// How long `start` waits for systemd to report the start job's result.
const START_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct SystemdRunner {
    conn: zbus::Connection,
}

fn unit_name(id: JobId) -> String {
    format!("gpuq-job-{id}.service")
}

/// What runs the user's command (see the module's doc).
const SHELL: &str = "/bin/bash";
/// What sets the environment entries `Environment=` cannot carry.
const ENV: &str = "/usr/bin/env";

/// `$` → `$$`: what systemd turns back into one literal `$` in ExecStart.
fn escape_dollars(arg: &str) -> String {
    arg.replace('$', "$$")
}

/// Whether systemd takes `name=value` in a transient unit's `Environment=`
/// on every version we run on (239 and later): `env_name_is_valid` — not
/// empty, not starting with a digit, only ASCII letters, digits and `_` —
/// and `env_value_is_valid` as strict as 239's (no control character but
/// TAB; newer versions allow more, 239 does not).
fn systemd_takes(name: &str, value: &str) -> bool {
    let name_ok = name
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    name_ok && !value.chars().any(|c| c.is_control() && c != '\t')
}

/// The job's environment split into what goes into `Environment=` and what
/// `env(1)` sets (in order; a later entry of the same name wins, as the
/// broker's own entries come last — systemd would refuse duplicates).
fn split_env(env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, (k, _)) in env.iter().enumerate() {
        last.insert(k.as_str(), i);
    }
    let (mut unit, mut by_env) = (Vec::new(), Vec::new());
    for (i, (k, v)) in env.iter().enumerate() {
        if last.get(k.as_str()) != Some(&i) {
            continue;
        }
        if systemd_takes(k, v) {
            unit.push(format!("{k}={v}"));
        } else {
            by_env.push(format!("{k}={v}"));
        }
    }
    (unit, by_env)
}

/// `ExecStart`'s (path, argv) for the job, before `$` escaping.
fn exec_start(spec: &JobSpec, by_env: &[String]) -> (String, Vec<String>) {
    let mut argv: Vec<String> = Vec::new();
    let path = if by_env.is_empty() {
        SHELL
    } else {
        // `--` ends env's options; every entry has a `=` (filter_env drops
        // names with one), so env takes each as an assignment up to SHELL.
        argv.extend(["env".to_string(), "--".to_string()]);
        argv.extend(by_env.iter().cloned());
        ENV
    };
    argv.extend([
        SHELL.to_string(),
        "--posix".to_string(),
        "-c".to_string(),
        "exec \"$@\"".to_string(),
        format!("gpuq-job-{}", spec.id),
    ]);
    argv.extend(spec.argv.iter().cloned());
    (path.to_string(), argv)
}

/// systemd resolves `User=`, `Group=` and `SupplementaryGroups=` in the
/// user database even when they are numeric, and a unit whose IDs have no
/// entry dies before its command runs (status 217/USER or 216/GROUP, which
/// would look like the job's own exit code). Refuse such a job up front with
/// the reason; the broker records it as "could not start".
fn known_ids(spec: &JobSpec) -> Result<(), RunnerError> {
    use nix::unistd::{Gid, Group, Uid, User};
    let refuse = |what: String| RunnerError::State {
        id: spec.id,
        what: format!(
            "{what} has no entry in the user database; \
             systemd runs a unit only as a known user and groups"
        ),
    };
    match User::from_uid(Uid::from_raw(spec.uid)) {
        Ok(Some(_)) => {}
        Ok(None) => return Err(refuse(format!("uid {}", spec.uid))),
        Err(e) => return Err(refuse(format!("uid {} ({e})", spec.uid))),
    }
    for gid in std::iter::once(&spec.gid).chain(spec.groups.iter()) {
        match Group::from_gid(Gid::from_raw(*gid)) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(refuse(format!("gid {gid}"))),
            Err(e) => return Err(refuse(format!("gid {gid} ({e})"))),
        }
    }
    Ok(())
}

/// `ExecMainCode` values (siginfo `si_code`).
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
const CLD_DUMPED: i32 = 3;
/// The exit statuses systemd's own set-up steps use (EXIT_CHDIR=200 …).
const SYSTEMD_EXIT_CODES: std::ops::RangeInclusive<i32> = 200..=245;

/// Why systemd failed the unit's start job (`result`: the job's result,
/// e.g. "failed"; `status`: the unit's `ExecMainStatus`).
fn start_failure(spec: &JobSpec, result: &str, status: Option<i32>) -> RunnerError {
    let step = match status {
        Some(200) => format!(" at step CHDIR: cannot enter {}", spec.cwd),
        Some(203) => format!(" at step EXEC: cannot execute {SHELL} or {ENV}"),
        Some(209) => format!(
            " at step STDOUT: cannot use the log file {}",
            spec.log_path.display()
        ),
        Some(216) => " at step GROUP: cannot set the groups".to_string(),
        Some(217) => " at step USER: cannot become the user".to_string(),
        Some(n) if n > 0 => format!(" (status {n}, see systemd.exec(5), PROCESS EXIT CODES)"),
        _ => String::new(),
    };
    RunnerError::State {
        id: spec.id,
        what: format!(
            "systemd could not start {} (job result {result}){step}",
            unit_name(spec.id)
        ),
    }
}

fn err(e: zbus::Error) -> RunnerError {
    RunnerError::Systemd(e.to_string())
}

impl SystemdRunner {
    pub async fn connect() -> Result<Self, RunnerError> {
        let conn = zbus::Connection::system().await.map_err(|e| {
            RunnerError::Systemd(format!(
                "cannot reach the system bus ({e}); on a host without systemd set broker.runner = \"direct\""
            ))
        })?;
        let runner = SystemdRunner { conn };
        // Without a subscriber systemd sends no unit signals on the system
        // bus; with one, the bus daemon passes on only what we match.
        runner
            .manager("Subscribe", &())
            .await
            .map_err(|e| RunnerError::Systemd(format!("systemd refused Subscribe: {e}")))?;
        Ok(runner)
    }

    async fn manager<B>(&self, method: &str, body: &B) -> Result<zbus::Message, zbus::Error>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.conn
            .call_method(Some(DEST), PATH, Some(MANAGER), method, body)
            .await
    }

    /// The unit's object path, or `None` if systemd does not know it.
    async fn unit(&self, id: JobId) -> Result<Option<OwnedObjectPath>, RunnerError> {
        match self.manager("GetUnit", &(unit_name(id),)).await {
            Ok(m) => Ok(Some(m.body().deserialize().map_err(err)?)),
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(None)
            }
            Err(e) => Err(err(e)),
        }
    }

    async fn prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<OwnedValue, RunnerError> {
        let m = self
            .conn
            .call_method(
                Some(DEST),
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(iface, name),
            )
            .await
            .map_err(err)?;
        m.body().deserialize::<OwnedValue>().map_err(err)
    }

    async fn string_prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<String, RunnerError> {
        let v = self.prop(path, iface, name).await?;
        String::try_from(v).map_err(|e| RunnerError::Systemd(format!("{name}: {e}")))
    }

    async fn int_prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<i32, RunnerError> {
        let v = self.prop(path, iface, name).await?;
        i32::try_from(v).map_err(|e| RunnerError::Systemd(format!("{name}: {e}")))
    }

    /// The unit's (ExecMainCode, ExecMainStatus), if systemd has them.
    async fn main_exit(&self, id: JobId) -> Option<(i32, i32)> {
        let path = self.unit(id).await.ok()??;
        let svc = "org.freedesktop.systemd1.Service";
        let code = self.int_prop(&path, svc, "ExecMainCode").await.ok()?;
        let status = self.int_prop(&path, svc, "ExecMainStatus").await.ok()?;
        Some((code, status))
    }

    /// (ActiveState, SubState), or `None` when the unit is gone.
    async fn states(&self, id: JobId) -> Result<Option<(String, String)>, RunnerError> {
        let Some(path) = self.unit(id).await? else {
            return Ok(None);
        };
        let unit = "org.freedesktop.systemd1.Unit";
        Ok(Some((
            self.string_prop(&path, unit, "ActiveState").await?,
            self.string_prop(&path, unit, "SubState").await?,
        )))
    }

    /// Until the unit's (ActiveState, SubState) satisfies `done` — `None`:
    /// the unit is gone — or `within` has passed (`Err(None)`). Woken by
    /// the unit's `PropertiesChanged` signals (listened for before the
    /// first look, so none is missed), and every [`RECHECK`] anyway.
    async fn until(
        &self,
        id: JobId,
        within: Option<Duration>,
        done: impl Fn(&str, &str) -> bool,
    ) -> Result<Option<(String, String)>, Option<RunnerError>> {
        use zbus::export::futures_util::StreamExt;
        let Some(path) = self.unit(id).await.map_err(Some)? else {
            return Ok(None);
        };
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(path.as_str())
            .and_then(|b| b.interface("org.freedesktop.DBus.Properties"))
            .and_then(|b| b.member("PropertiesChanged"))
            .map_err(|e| Some(err(e)))?
            .build()
            .to_owned();
        let mut changes = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(64))
            .await
            .map_err(|e| Some(err(e)))?;
        let deadline = within.map(|w| tokio::time::Instant::now() + w);
        loop {
            match self.states(id).await.map_err(Some)? {
                None => return Ok(None),
                Some((active, sub)) if done(&active, &sub) => return Ok(Some((active, sub))),
                Some(_) => {}
            }
            let mut wake = tokio::time::Instant::now() + RECHECK;
            if let Some(d) = deadline {
                if tokio::time::Instant::now() >= d {
                    return Err(None);
                }
                wake = wake.min(d);
            }
            // A signal, or the time to look anyway; a closed stream (the
            // connection is gone) leaves the next look to report it.
            let _ = tokio::time::timeout_at(wake, changes.next()).await;
        }
    }
}

#[async_trait]
impl Runner for SystemdRunner {
    fn name(&self) -> &'static str {
        "systemd"
    }

    async fn start(&self, spec: &JobSpec, log: File) -> Result<(), RunnerError> {
        known_ids(spec)?;
        let (env, by_env) = split_env(&spec.env);
        if !by_env.is_empty() {
            let names: Vec<&str> = by_env
                .iter()
                .map(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k))
                .collect();
            tracing::debug!(job = %spec.id, "environment through env(1): {}", names.join(" "));
        }
        let (path, argv) = exec_start(spec, &by_env);
        // systemd substitutes `$NAME`, `${NAME}` and `$$` in ExecStart when
        // it spawns the process, also in a transient unit's: `$$` in a
        // user's `bash -c 'echo $$'` would reach bash as `$`, `$HOME` as
        // the unit's value. Every `$` is sent as `$$` (systemd's literal
        // dollar, understood by every version; the `:` no-expansion prefix
        // needs 243+, and EL8 has 239).
        let argv: Vec<String> = argv.iter().map(|a| escape_dollars(a)).collect();
        let exec: Vec<(String, Vec<String>, bool)> = vec![(path, argv, false)];
        let groups: Vec<String> = spec.groups.iter().map(|g| g.to_string()).collect();
        // A backstop only: the broker enforces the limit itself.
        let runtime_max_usec = (spec.time_limit_secs + 300) * 1_000_000;
        let props: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(format!("gpuq job {}", spec.id))),
            ("ExecStart", Value::from(exec)),
            ("Type", Value::from("exec")),
            ("RemainAfterExit", Value::from(true)),
            ("KillMode", Value::from("control-group")),
            ("User", Value::from(spec.uid.to_string())),
            ("Group", Value::from(spec.gid.to_string())),
            ("SupplementaryGroups", Value::from(groups)),
            ("WorkingDirectory", Value::from(spec.cwd.clone())),
            ("Environment", Value::from(env)),
            ("StandardInput", Value::from("null")),
            // The broker's own open file description (O_APPEND), sent with
            // the message: systemd dup2()s it to 1 and 2, opening nothing.
            (
                "StandardOutputFileDescriptor",
                Value::Fd(Fd::from(log.as_fd())),
            ),
            (
                "StandardErrorFileDescriptor",
                Value::Fd(Fd::from(log.as_fd())),
            ),
            ("RuntimeMaxUSec", Value::from(runtime_max_usec)),
        ];
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = vec![];
        // With Type=exec systemd finishes the start job once /bin/sh has
        // been exec'd, and fails it when a step before failed (user,
        // groups, working directory, log file). Listen for the job's end
        // before asking, so that the signal cannot be missed.
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(PATH)
            .and_then(|b| b.interface(MANAGER))
            .and_then(|b| b.member("JobRemoved"))
            .map_err(err)?
            .build();
        let mut removed = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(256))
            .await
            .map_err(err)?;
        let reply = self
            .manager(
                "StartTransientUnit",
                &(unit_name(spec.id), "fail", props, aux),
            )
            .await
            .map_err(err)?;
        let job: OwnedObjectPath = reply.body().deserialize().map_err(err)?;
        let systemd = reply.header().sender().map(|s| s.to_owned());
        let result = tokio::time::timeout(START_WAIT, async {
            use zbus::export::futures_util::StreamExt;
            while let Some(msg) = removed.next().await {
                let Ok(msg) = msg else { continue };
                if systemd.is_some() && msg.header().sender().map(|s| s.to_owned()) != systemd {
                    continue;
                }
                if let Ok((_, path, _, result)) = msg
                    .body()
                    .deserialize::<(u32, OwnedObjectPath, String, String)>()
                {
                    if path == job {
                        return Some(result);
                    }
                }
            }
            None
        })
        .await;
        match result {
            Ok(Some(r)) if r == "done" => Ok(()),
            // A command that ends at once can also fail the start job: its
            // exit can reach systemd before the news that exec succeeded.
            // Then the status is the job's own (wait() records it); systemd's
            // own set-up failures use 200..=245 (systemd.exec(5)).
            Ok(Some(r)) => match self.main_exit(spec.id).await {
                Some((CLD_EXITED, status)) if !SYSTEMD_EXIT_CODES.contains(&status) => Ok(()),
                Some((CLD_KILLED | CLD_DUMPED, _)) => Ok(()),
                other => Err(start_failure(spec, &r, other.map(|(_, s)| s))),
            },
            // No word from systemd (yet): supervision sees what happens.
            Ok(None) | Err(_) => {
                tracing::warn!(job = %spec.id, "no JobRemoved signal for {}", job.as_str());
                Ok(())
            }
        }
    }

    async fn alive(&self, id: JobId) -> Result<bool, RunnerError> {
        Ok(match self.states(id).await? {
            None => false,
            Some((active, sub)) => {
                matches!(active.as_str(), "active" | "activating" | "deactivating")
                    && sub != "exited"
            }
        })
    }

    async fn wait(&self, id: JobId) -> Result<Option<Outcome>, RunnerError> {
        let ended = self
            .until(id, None, |active, sub| {
                sub == "exited" || active == "failed" || active == "inactive"
            })
            .await
            .map_err(|e| {
                e.unwrap_or_else(|| RunnerError::State {
                    id,
                    what: "the wait for its end stopped".into(),
                })
            })?;
        if ended.is_none() {
            return Ok(None);
        }
        let outcome = match self.unit(id).await? {
            None => None,
            Some(path) => {
                let svc = "org.freedesktop.systemd1.Service";
                let code = self.int_prop(&path, svc, "ExecMainCode").await?;
                let status = self.int_prop(&path, svc, "ExecMainStatus").await?;
                match code {
                    1 => Some(Outcome {
                        exit_code: Some(status),
                        signal: None,
                    }),
                    2 | 3 => Some(Outcome {
                        exit_code: None,
                        signal: Some(status),
                    }),
                    _ => None,
                }
            }
        };
        // The job's other processes end with its main process.
        self.kill(id).await?;
        Ok(outcome)
    }

    async fn kill(&self, id: JobId) -> Result<(), RunnerError> {
        if self.unit(id).await?.is_none() {
            return Ok(());
        }
        let _ = self
            .manager("KillUnit", &(unit_name(id), "all", libc::SIGKILL))
            .await;
        let _ = self.manager("StopUnit", &(unit_name(id), "replace")).await;
        match self
            .until(id, Some(Duration::from_secs(10)), |active, _| {
                active == "inactive" || active == "failed"
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(Some(e)) => Err(e),
            Err(None) => Err(RunnerError::State {
                id,
                what: format!("{} did not stop within 10s", unit_name(id)),
            }),
        }
    }

    async fn release(&self, id: JobId) -> Result<(), RunnerError> {
        let _ = self.manager("ResetFailedUnit", &(unit_name(id),)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_reach_the_job_literally() {
        assert_eq!(escape_dollars("exec \"$@\""), "exec \"$$@\"");
        assert_eq!(
            escape_dollars("echo $$ ${HOME} $X 100%"),
            "echo $$$$ $${HOME} $$X 100%"
        );
        assert_eq!(escape_dollars("plain"), "plain");
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_and_values_systemd_refuses_go_through_env() {
        let (unit, by_env) = split_env(&env(&[
            ("PATH", "/usr/bin:/bin"),
            ("_under", "x"),
            ("TABBED", "a\tb"),
            ("DOLLAR", "$HOME 100%"),
            ("BASH_FUNC_module%%", "() {  eval x\n}"),
            ("with.dot", "1"),
            ("with-dash", "2"),
            ("9LIVES", "3"),
            ("ESC", "a\u{1b}b"),
            ("NL", "a\nb"),
            ("DEL", "a\u{7f}"),
            ("Ünicode", "4"),
        ]));
        assert_eq!(
            unit,
            [
                "PATH=/usr/bin:/bin",
                "_under=x",
                "TABBED=a\tb",
                "DOLLAR=$HOME 100%"
            ]
        );
        assert_eq!(
            by_env,
            [
                "BASH_FUNC_module%%=() {  eval x\n}",
                "with.dot=1",
                "with-dash=2",
                "9LIVES=3",
                "ESC=a\u{1b}b",
                "NL=a\nb",
                "DEL=a\u{7f}",
                "Ünicode=4",
            ]
        );
    }

    #[test]
    fn a_repeated_name_is_sent_once_with_its_last_value() {
        let (unit, by_env) = split_env(&env(&[
            ("A", "first"),
            ("x.y", "1"),
            ("B", "b"),
            ("A", "second"),
            ("x.y", "2"),
        ]));
        assert_eq!(unit, ["B=b", "A=second"]);
        assert_eq!(by_env, ["x.y=2"]);
    }

    fn spec(argv: &[&str]) -> JobSpec {
        JobSpec {
            id: JobId(7),
            uid: 0,
            gid: 0,
            groups: vec![],
            user: "root".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: "/".into(),
            env: vec![],
            log_path: "/dev/null".into(),
            time_limit_secs: 60,
        }
    }

    #[test]
    fn exec_start_is_bash_posix_and_env_only_when_needed() {
        let (path, argv) = exec_start(&spec(&["python", "x.py"]), &[]);
        assert_eq!(path, "/bin/bash");
        assert_eq!(
            argv,
            [
                "/bin/bash",
                "--posix",
                "-c",
                "exec \"$@\"",
                "gpuq-job-7",
                "python",
                "x.py"
            ]
        );
        let (path, argv) = exec_start(&spec(&["true"]), &["a.b=1".to_string()]);
        assert_eq!(path, "/usr/bin/env");
        assert_eq!(
            argv,
            [
                "env",
                "--",
                "a.b=1",
                "/bin/bash",
                "--posix",
                "-c",
                "exec \"$@\"",
                "gpuq-job-7",
                "true"
            ]
        );
    }

    #[test]
    fn ids_without_a_user_database_entry_are_refused_before_systemd() {
        let mut spec = JobSpec {
            id: JobId(7),
            uid: 0,
            gid: 0,
            groups: vec![0],
            user: "root".into(),
            argv: vec!["true".into()],
            cwd: "/".into(),
            env: vec![],
            log_path: "/dev/null".into(),
            time_limit_secs: 60,
        };
        assert!(known_ids(&spec).is_ok());
        // No test machine has these IDs in its user database.
        spec.uid = 3_999_999_001;
        let e = known_ids(&spec).unwrap_err().to_string();
        assert!(e.contains("uid 3999999001 has no entry"), "{e}");
        spec.uid = 0;
        spec.groups = vec![0, 3_999_999_002];
        let e = known_ids(&spec).unwrap_err().to_string();
        assert!(e.contains("gid 3999999002 has no entry"), "{e}");
    }
}
