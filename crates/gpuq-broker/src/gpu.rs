//! The GPU idle gate: a job starts only when no compute process uses the GPU.
//!
//! `gpu = "nvml"` asks NVML, which is loaded at run time from the NVIDIA
//! driver's `libnvidia-ml.so.1` (through `nvml-wrapper`); nothing links
//! against the driver at build time. When NVML cannot be loaded or queried,
//! the gate stays closed and says why: an unknown GPU is not an idle GPU.
//! `gpu = "none"` is for hosts without a GPU (tests, the demo).

use std::sync::Mutex;

/// Asks whether the GPU is idle.
pub trait GpuProbe: Send + Sync + std::fmt::Debug {
    /// `Ok(None)`: idle. `Ok(Some(what))`: busy, `what` names the processes.
    /// `Err(why)`: cannot tell.
    fn busy(&self) -> Result<Option<String>, String>;
    fn name(&self) -> &'static str;
}

/// No GPU on this host: always idle.
#[derive(Debug, Default)]
pub struct NoGpu;

impl GpuProbe for NoGpu {
    fn busy(&self) -> Result<Option<String>, String> {
        Ok(None)
    }
    fn name(&self) -> &'static str {
        "none"
    }
}

/// NVML, loaded lazily; a failed load is retried on the next question (the
/// driver may be reinstalled while the broker runs).
pub struct Nvml {
    inner: Mutex<Option<nvml_wrapper::Nvml>>,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

impl Nvml {
    pub fn new() -> Self {
        Nvml {
            inner: Mutex::new(None),
        }
    }
}

impl Default for Nvml {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuProbe for Nvml {
    fn busy(&self) -> Result<Option<String>, String> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?);
        }
        let Some(nvml) = guard.as_ref() else {
            return Err("NVML not initialised".into());
        };
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        let mut users = Vec::new();
        for i in 0..count {
            let dev = nvml
                .device_by_index(i)
                .map_err(|e| format!("NVML device {i}: {e}"))?;
            let procs = dev
                .running_compute_processes()
                .map_err(|e| format!("NVML device {i} processes: {e}"))?;
            users.extend(procs.iter().map(|p| format!("gpu{i}: pid {}", p.pid)));
        }
        Ok((!users.is_empty()).then(|| users.join(", ")))
    }
    fn name(&self) -> &'static str {
        "nvml"
    }
}
