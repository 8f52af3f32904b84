//! Process helpers: peer credentials, privilege drop and cgroup placement in `pre_exec`.
