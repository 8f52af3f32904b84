//! Fault points: test builds only (cargo feature `fault-points`, enabled
//! for this crate's own tests through its dev-dependency on itself; never
//! in a packaged build).
//!
//! A test registers a closure for one device (its kernel name, e.g.
//! `loop3`) at one [`Point`] of the wipe's second phase; the wipe thread of
//! that device runs it there, once. The closure injects a *real* fault
//! (resizes the loop device, shuts down the filesystem its backing file is
//! on, turns discard off, writes a signature): the hook only opens the
//! window between the checks and the discard that no test could otherwise
//! reach deterministically. Without the feature the points compile to
//! nothing.

use std::sync::Mutex;

/// Where in phase 2 a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Every check passed on every device; before `BLKGETSIZE64` and the
    /// `BLKDISCARD` on the held descriptor.
    BeforeDiscard,
    /// `BLKDISCARD` succeeded; before the verifying libblkid probe.
    AfterDiscard,
}

type Hook = Box<dyn FnOnce() + Send>;

static HOOKS: Mutex<Vec<(u64, Point, String, Hook)>> = Mutex::new(Vec::new());
static NEXT: Mutex<u64> = Mutex::new(0);

/// Removes its hook (if it has not run) when dropped, so that a test that
/// fails early leaves nothing behind for a later device of the same name.
#[derive(Debug)]
#[must_use = "the hook is removed when the guard is dropped"]
pub struct HookGuard(u64);

impl Drop for HookGuard {
    fn drop(&mut self) {
        let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
        hooks.retain(|(id, ..)| *id != self.0);
    }
}

/// Run `f` once when the wipe of `device` (kernel name) reaches `point`.
pub fn at(point: Point, device: &str, f: impl FnOnce() + Send + 'static) -> HookGuard {
    let id = {
        let mut n = NEXT.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        *n
    };
    HOOKS.lock().unwrap_or_else(|e| e.into_inner()).push((
        id,
        point,
        device.to_string(),
        Box::new(f),
    ));
    HookGuard(id)
}

/// Called by the wipe: run (and forget) the hook registered for `device`
/// at `point`, if any.
pub(crate) fn reached(point: Point, device: &str) {
    let hook = {
        let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
        hooks
            .iter()
            .position(|(_, p, d, _)| *p == point && d == device)
            .map(|i| hooks.remove(i).3)
    };
    if let Some(f) = hook {
        f();
    }
}
