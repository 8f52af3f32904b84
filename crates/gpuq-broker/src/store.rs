//! The job store: SQLite (bundled), WAL, `synchronous=FULL`.
//!
//! A submission is committed — and so on disk — before the broker answers
//! the client, and every state change is committed before the broker acts on
//! it. State changes are conditional updates (`WHERE state = 'queued'`), so a
//! job can move from `queued` to `running` exactly once: a job is never run
//! twice, even across crashes.

use crate::policy::QueueEntry;
use gpuq_protocol::{JobId, JobState, JobView};
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("job store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("job store {path}: corrupt row for job {id}: {what}")]
    Corrupt {
        path: PathBuf,
        id: u64,
        what: String,
    },
}

/// Everything the broker keeps about a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: JobId,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub user: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub name: Option<String>,
    pub inst: Option<String>,
    pub stor: Option<String>,
    pub time_limit_secs: u64,
    pub state: JobState,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    pub log_path: PathBuf,
}

impl Job {
    /// Whether the job has a lease on the storage nodes (`--inst` or
    /// `--stor`): it starts, ends and recovers through the lease.
    pub fn leased(&self) -> bool {
        self.inst.is_some() || self.stor.is_some()
    }

    pub fn into_view(self) -> JobView {
        JobView {
            id: self.id,
            uid: self.uid,
            user: self.user,
            state: self.state,
            name: self.name,
            argv: self.argv,
            cwd: self.cwd,
            inst: self.inst,
            stor: self.stor,
            submitted_at: self.submitted_at,
            started_at: self.started_at,
            ended_at: self.ended_at,
            time_limit_secs: self.time_limit_secs,
            exit_code: self.exit_code,
            signal: self.signal,
            reason: self.reason,
            log_path: self.log_path.display().to_string(),
            hidden: false,
        }
    }

    pub fn view(&self) -> JobView {
        self.clone().into_view()
    }
}

/// A job about to be stored; `log_path` is derived from the assigned ID.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub user: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub name: Option<String>,
    pub inst: Option<String>,
    pub stor: Option<String>,
    pub time_limit_secs: u64,
    pub submitted_at: i64,
}

/// How a job ended, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    pub ended_at: i64,
}

#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// Calls into SQLite since the store was opened (reads and writes):
    /// `GET /v1/stats` shows it, so a test can prove that something (e.g.
    /// 200 `gpuq follow`s) costs no queries.
    queries: std::sync::atomic::AtomicU64,
    /// Bumped by every write, under the connection's lock: a reader that
    /// notes it under the same lock knows exactly which state it read
    /// (the broker's list cache keys on it).
    generation: std::sync::atomic::AtomicU64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    uid          INTEGER NOT NULL,
    gid          INTEGER NOT NULL,
    groups       TEXT    NOT NULL,
    user         TEXT    NOT NULL,
    argv         TEXT    NOT NULL,
    cwd          TEXT    NOT NULL,
    env          TEXT    NOT NULL,
    name         TEXT,
    inst         TEXT,
    stor         TEXT,
    time_limit   INTEGER NOT NULL,
    state        TEXT    NOT NULL,
    submitted_at INTEGER NOT NULL,
    started_at   INTEGER,
    ended_at     INTEGER,
    exit_code    INTEGER,
    signal       INTEGER,
    reason       TEXT,
    log_path     TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, id);
CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs(ended_at);
-- A DAOS job's preparation (lease to job start) and cleanup (job end to
-- release) in seconds, for `gpuq stats`; a row only once one is known.
CREATE TABLE IF NOT EXISTS daos_times (
    job          INTEGER PRIMARY KEY REFERENCES jobs(id),
    prepare_secs REAL,
    cleanup_secs REAL
);
";

const COLUMNS: &str = "id, uid, gid, groups, user, argv, cwd, env, name, inst, stor, time_limit, \
                       state, submitted_at, started_at, ended_at, exit_code, signal, reason, log_path";

impl Store {
    /// Open (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let err = |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(err)?;
        // WAL + FULL: a commit is on disk (WAL fsynced) when `execute` returns.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(Store {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            queries: std::sync::atomic::AtomicU64::new(0),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// How many calls into SQLite this store has made.
    pub fn queries(&self) -> u64 {
        self.queries.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The store's generation now: it changes with every write.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, rusqlite::Error>,
    ) -> Result<T, StoreError> {
        // A poisoned lock means a panic mid-call; SQLite rolled the statement
        // back, so the connection itself is still consistent.
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f(&mut conn).map_err(|source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        })
    }

    /// [`Store::with`] for a write: the generation moves on before the
    /// lock is released, also when the write failed (it may have done part).
    fn write<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, rusqlite::Error>,
    ) -> Result<T, StoreError> {
        self.with(|c| {
            let r = f(c);
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            r
        })
    }

    /// Store a new queued job durably; returns the stored job.
    pub fn insert(&self, new: &NewJob, log_root: &Path) -> Result<Job, StoreError> {
        let id = self.write(|c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO jobs (uid, gid, groups, user, argv, cwd, env, name, inst, stor,
                                   time_limit, state, submitted_at, log_path)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'queued', ?12, '')",
                params![
                    new.uid,
                    new.gid,
                    json(&new.groups),
                    new.user,
                    json(&new.argv),
                    new.cwd,
                    json(&new.env),
                    new.name,
                    new.inst,
                    new.stor,
                    new.time_limit_secs as i64,
                    new.submitted_at,
                ],
            )?;
            let id = tx.last_insert_rowid();
            let log = log_path(log_root, new.uid, JobId(id as u64));
            tx.execute(
                "UPDATE jobs SET log_path = ?1 WHERE id = ?2",
                params![log.display().to_string(), id],
            )?;
            tx.commit()?;
            Ok(id)
        })?;
        self.get(JobId(id as u64))?
            .ok_or_else(|| StoreError::Corrupt {
                path: self.path.clone(),
                id: id as u64,
                what: "vanished right after insert".into(),
            })
    }

    pub fn get(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        let row = self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
                params![id.0 as i64],
                RawJob::from_row,
            )
            .optional()
        })?;
        row.map(|r| r.into_job(&self.path)).transpose()
    }

    /// Jobs in `states` (all jobs for `None`), oldest first. With
    /// `with_env: false` the (large) environment column is not read: views
    /// and lists never show it.
    pub fn jobs(
        &self,
        states: Option<&[JobState]>,
        with_env: bool,
    ) -> Result<Vec<Job>, StoreError> {
        let filter = states.map_or(String::new(), |st| {
            format!("WHERE state IN ({})", in_list(st))
        });
        let columns = if with_env {
            COLUMNS.to_string()
        } else {
            COLUMNS.replace(" env,", " '[]',")
        };
        let rows = self.with(|c| {
            let mut st =
                c.prepare_cached(&format!("SELECT {columns} FROM jobs {filter} ORDER BY id"))?;
            let rows = st.query_map([], RawJob::from_row)?;
            rows.collect::<Result<Vec<_>, _>>()
        })?;
        rows.into_iter().map(|r| r.into_job(&self.path)).collect()
    }

    /// Call `f` with each job in `states` (all for `None`), oldest first,
    /// without its environment and without collecting them: `gpuq list --all`
    /// over a long history costs one row at a time, not the whole table.
    pub fn for_each_view(
        &self,
        states: Option<&[JobState]>,
        f: impl FnMut(JobView),
    ) -> Result<(), StoreError> {
        self.for_each_view_at(states, f).map(|_| ())
    }

    /// [`Store::for_each_view`], returning the generation it read at.
    pub fn for_each_view_at(
        &self,
        states: Option<&[JobState]>,
        mut f: impl FnMut(JobView),
    ) -> Result<u64, StoreError> {
        let filter = states.map_or(String::new(), |st| {
            format!("WHERE state IN ({})", in_list(st))
        });
        let columns = COLUMNS.replace(" env,", " '[]',");
        let mut bad = None;
        let generation = self.with(|c| {
            let generation = self.generation();
            let mut st =
                c.prepare_cached(&format!("SELECT {columns} FROM jobs {filter} ORDER BY id"))?;
            let mut rows = st.query([])?;
            while let Some(row) = rows.next()? {
                match RawJob::from_row(row)?.into_job(&self.path) {
                    Ok(job) => f(job.into_view()),
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            Ok(generation)
        })?;
        bad.map_or(Ok(generation), Err)
    }

    /// Jobs in `states`, oldest first, complete.
    pub fn by_state(&self, states: &[JobState]) -> Result<Vec<Job>, StoreError> {
        self.jobs(Some(states), true)
    }

    /// The queue as the gate needs it: (id, uid) of queued jobs, oldest first.
    pub fn queue(&self) -> Result<Vec<QueueEntry>, StoreError> {
        self.with(|c| {
            let mut st =
                c.prepare_cached("SELECT id, uid FROM jobs WHERE state = 'queued' ORDER BY id")?;
            let rows = st.query_map([], |r| {
                Ok(QueueEntry {
                    id: JobId(r.get::<_, i64>(0)? as u64),
                    uid: r.get::<_, i64>(1)? as u32,
                })
            })?;
            rows.collect()
        })
    }

    /// How many jobs are in `states` (and older than `before`, if given).
    pub fn count(&self, states: &[JobState], before: Option<JobId>) -> Result<usize, StoreError> {
        let list = in_list(states);
        let before = before.map_or(i64::MAX, |b| b.0 as i64);
        self.with(|c| {
            c.prepare_cached(&format!(
                "SELECT COUNT(*) FROM jobs WHERE state IN ({list}) AND id < ?1"
            ))?
            .query_row(params![before], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
        })
    }

    /// `queued` → `running`, durably. False if the job was not queued any more
    /// (cancelled meanwhile): then it must not be started.
    pub fn mark_running(&self, id: JobId, at: i64) -> Result<bool, StoreError> {
        let n = self.write(|c| {
            c.execute(
                "UPDATE jobs SET state = 'running', started_at = ?1 WHERE id = ?2 AND state = 'queued'",
                params![at, id.0 as i64],
            )
        })?;
        Ok(n == 1)
    }

    /// Record how a job ended, if it was in `from`. False if it was not.
    pub fn finish(&self, id: JobId, from: JobState, end: &Ending) -> Result<bool, StoreError> {
        let n = self.write(|c| {
            c.execute(
                "UPDATE jobs SET state = ?1, exit_code = ?2, signal = ?3, reason = ?4, ended_at = ?5
                 WHERE id = ?6 AND state = ?7",
                params![
                    end.state.as_str(),
                    end.exit_code,
                    end.signal,
                    end.reason,
                    end.ended_at,
                    id.0 as i64,
                    from.as_str()
                ],
            )
        })?;
        Ok(n == 1)
    }
}

impl Store {
    /// Record how long a DAOS job's preparation or cleanup took.
    /// Not a queue change: the generation (the list cache's key) stays.
    pub fn daos_time(&self, id: JobId, phase: DaosPhase, secs: f64) -> Result<(), StoreError> {
        let column = match phase {
            DaosPhase::Prepare => "prepare_secs",
            DaosPhase::Cleanup => "cleanup_secs",
        };
        self.with(|c| {
            c.execute(
                &format!(
                    "INSERT INTO daos_times (job, {column}) VALUES (?1, ?2)
                     ON CONFLICT(job) DO UPDATE SET {column} = excluded.{column}"
                ),
                params![id.0 as i64, secs],
            )
            .map(|_| ())
        })
    }

    /// Every job that ended in `[since, until)`, `uid`'s only if given.
    pub fn ended_between(
        &self,
        since: i64,
        until: i64,
        uid: Option<u32>,
    ) -> Result<Vec<EndedJob>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT j.uid, j.user, j.state, j.submitted_at, j.started_at, j.ended_at,
                        j.inst IS NOT NULL, d.prepare_secs, d.cleanup_secs
                 FROM jobs j LEFT JOIN daos_times d ON d.job = j.id
                 WHERE j.ended_at >= ?1 AND j.ended_at < ?2 AND (?3 IS NULL OR j.uid = ?3)
                 ORDER BY j.id",
            )?;
            let rows = st.query_map(params![since, until, uid], |r| {
                Ok(EndedJob {
                    uid: r.get(0)?,
                    user: r.get(1)?,
                    state: r.get(2)?,
                    submitted_at: r.get(3)?,
                    started_at: r.get(4)?,
                    ended_at: r.get(5)?,
                    daos: r.get(6)?,
                    prepare_secs: r.get(7)?,
                    cleanup_secs: r.get(8)?,
                })
            })?;
            rows.collect()
        })
    }
}

/// The two timed phases of a DAOS lease (`daos_times`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaosPhase {
    /// Lease to job start.
    Prepare,
    /// Job end to release.
    Cleanup,
}

/// One ended job as `gpuq stats` counts it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedJob {
    pub uid: u32,
    pub user: String,
    pub state: String,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: i64,
    pub daos: bool,
    pub prepare_secs: Option<f64>,
    pub cleanup_secs: Option<f64>,
}

/// `'queued','running'`: states are our own constants, never user input.
fn in_list(states: &[JobState]) -> String {
    states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// `<log_root>/<uid>/gpuq-<id>.log`
pub fn log_path(log_root: &Path, uid: u32, id: JobId) -> PathBuf {
    log_root
        .join(uid.to_string())
        .join(format!("gpuq-{id}.log"))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    // Serialising plain vectors of strings/integers cannot fail.
    serde_json::to_string(v).unwrap_or_default()
}

struct RawJob {
    id: i64,
    uid: i64,
    gid: i64,
    groups: String,
    user: String,
    argv: String,
    cwd: String,
    env: String,
    name: Option<String>,
    inst: Option<String>,
    stor: Option<String>,
    time_limit: i64,
    state: String,
    submitted_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    reason: Option<String>,
    log_path: String,
}

impl RawJob {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawJob {
            id: r.get(0)?,
            uid: r.get(1)?,
            gid: r.get(2)?,
            groups: r.get(3)?,
            user: r.get(4)?,
            argv: r.get(5)?,
            cwd: r.get(6)?,
            env: r.get(7)?,
            name: r.get(8)?,
            inst: r.get(9)?,
            stor: r.get(10)?,
            time_limit: r.get(11)?,
            state: r.get(12)?,
            submitted_at: r.get(13)?,
            started_at: r.get(14)?,
            ended_at: r.get(15)?,
            exit_code: r.get(16)?,
            signal: r.get(17)?,
            reason: r.get(18)?,
            log_path: r.get(19)?,
        })
    }

    fn into_job(self, path: &Path) -> Result<Job, StoreError> {
        let id = self.id as u64;
        let corrupt = |what: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            id,
            what,
        };
        fn decode<T: serde::de::DeserializeOwned>(
            field: &str,
            text: &str,
            corrupt: &dyn Fn(String) -> StoreError,
        ) -> Result<T, StoreError> {
            serde_json::from_str(text).map_err(|e| corrupt(format!("{field}: {e}")))
        }
        let groups: Vec<u32> = decode("groups", &self.groups, &corrupt)?;
        let argv: Vec<String> = decode("argv", &self.argv, &corrupt)?;
        let env: Vec<(String, String)> = decode("env", &self.env, &corrupt)?;
        let state = JobState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("state '{}'", self.state)))?;
        Ok(Job {
            id: JobId(id),
            uid: self.uid as u32,
            gid: self.gid as u32,
            groups,
            user: self.user,
            argv,
            cwd: self.cwd,
            env,
            name: self.name,
            inst: self.inst,
            stor: self.stor,
            time_limit_secs: self.time_limit as u64,
            state,
            submitted_at: self.submitted_at,
            started_at: self.started_at,
            ended_at: self.ended_at,
            exit_code: self.exit_code,
            signal: self.signal,
            reason: self.reason,
            log_path: PathBuf::from(self.log_path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_job(uid: u32) -> NewJob {
        NewJob {
            uid,
            gid: uid,
            groups: vec![uid, 27],
            user: format!("u{uid}"),
            argv: vec!["bash".into(), "-c".into(), "echo hi".into()],
            cwd: "/tmp".into(),
            env: vec![("PATH".into(), "/usr/bin".into())],
            name: Some("x".into()),
            inst: None,
            stor: None,
            time_limit_secs: 60,
            submitted_at: 1,
        }
    }

    #[test]
    fn ended_jobs_come_with_their_daos_times_within_the_period_and_for_the_uid() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("q.db")).unwrap();
        let mut daos = new_job(1000);
        daos.inst = Some("inst1".into());
        let a = store.insert(&daos, Path::new("/logs")).unwrap();
        let b = store.insert(&new_job(1001), Path::new("/logs")).unwrap();
        let c = store.insert(&new_job(1000), Path::new("/logs")).unwrap();
        for (id, end) in [(a.id, 100), (b.id, 200), (c.id, 300)] {
            assert!(store.mark_running(id, 10).unwrap());
            let e = Ending {
                state: JobState::Completed,
                exit_code: Some(0),
                signal: None,
                reason: None,
                ended_at: end,
            };
            assert!(store.finish(id, JobState::Running, &e).unwrap());
        }
        let g = store.generation();
        store.daos_time(a.id, DaosPhase::Prepare, 4.5).unwrap();
        store.daos_time(a.id, DaosPhase::Cleanup, 2.0).unwrap();
        store.daos_time(a.id, DaosPhase::Prepare, 5.5).unwrap(); // the last one counts
        assert_eq!(store.generation(), g, "a time is not a queue change");
        let all = store.ended_between(0, 1000, None).unwrap();
        assert_eq!(all.len(), 3);
        assert!(
            all[0].daos && all[0].prepare_secs == Some(5.5) && all[0].cleanup_secs == Some(2.0)
        );
        assert!(!all[1].daos && all[1].prepare_secs.is_none());
        // [since, until): 300 is out of [100, 300).
        let some = store.ended_between(100, 300, None).unwrap();
        assert_eq!(
            some.iter().map(|j| j.ended_at).collect::<Vec<_>>(),
            [100, 200]
        );
        let mine = store.ended_between(0, 1000, Some(1001)).unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].uid, 1001);
    }

    #[test]
    fn insert_get_and_transitions_are_conditional() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("q.db")).unwrap();
        let a = store.insert(&new_job(1000), Path::new("/logs")).unwrap();
        let b = store.insert(&new_job(1001), Path::new("/logs")).unwrap();
        assert!(b.id > a.id);
        assert_eq!(
            a.log_path,
            PathBuf::from(format!("/logs/1000/gpuq-{}.log", a.id))
        );
        assert_eq!(store.get(a.id).unwrap().unwrap(), a);
        assert!(store.mark_running(a.id, 5).unwrap());
        assert!(!store.mark_running(a.id, 6).unwrap(), "a job starts once");
        let end = Ending {
            state: JobState::Completed,
            exit_code: Some(0),
            signal: None,
            reason: None,
            ended_at: 9,
        };
        assert!(!store.finish(a.id, JobState::Queued, &end).unwrap());
        assert!(store.finish(a.id, JobState::Running, &end).unwrap());
        assert!(!store.finish(a.id, JobState::Running, &end).unwrap());
        let queued = store.by_state(&[JobState::Queued]).unwrap();
        assert_eq!(queued.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b.id]);
    }

    #[test]
    fn every_write_moves_the_generation_and_reads_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("q.db")).unwrap();
        let g0 = store.generation();
        let a = store.insert(&new_job(1000), Path::new("/logs")).unwrap();
        let g1 = store.generation();
        assert!(g1 > g0, "insert");
        let at = store.for_each_view_at(None, |_| {}).unwrap();
        assert_eq!(at, g1, "a read reports the generation it read at");
        store.get(a.id).unwrap();
        store.by_state(&[JobState::Queued]).unwrap();
        assert_eq!(store.generation(), g1, "reads leave it");
        assert!(store.mark_running(a.id, 5).unwrap());
        let g2 = store.generation();
        assert!(g2 > g1, "start");
        let end = Ending {
            state: JobState::Completed,
            exit_code: Some(0),
            signal: None,
            reason: None,
            ended_at: 9,
        };
        assert!(store.finish(a.id, JobState::Running, &end).unwrap());
        assert!(store.generation() > g2, "end");
    }

    #[test]
    fn jobs_survive_reopen_and_ids_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.db");
        let first = {
            let store = Store::open(&path).unwrap();
            store.insert(&new_job(1), Path::new("/l")).unwrap()
        };
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get(first.id).unwrap().unwrap(), first);
        let second = store.insert(&new_job(1), Path::new("/l")).unwrap();
        assert!(second.id > first.id);
    }
}
