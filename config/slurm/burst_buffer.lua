-- gpuq's burst_buffer.lua: a fresh, verified, wiped four-node DAOS system
-- as Slurm's per-job storage (docs/slurm.md). Slurm's burst_buffer/lua
-- plugin (slurm.conf: BurstBufferType=burst_buffer/lua) loads this file
-- from the directory of slurm.conf; each function below runs one verb of
-- gpuq-slurm as root and hands its one-line answer back to Slurm. All the
-- logic (records, leases, refusals, holds) is gpuq-slurm's; nothing of a
-- user's script reaches a shell here: only Slurm's job ID, uid, gid and
-- its own file paths are passed, each single-quoted.
--
-- A job asks for the site with one line in its script:
--   #BB_LUA daos pool=daos capacity=1 [profile=NAME]
--
-- Slurm 22.05 embeds Lua 5.1: io.popen's close() gives no exit status, so
-- the command prints it last.

-- Installed paths (the packages install them here; the test cluster
-- rewrites these two lines).
local GPUQ_SLURM = "/usr/libexec/gpuq/gpuq-slurm"
local GPUQ_SLURM_CONFIG = "/etc/gpuq/slurm.toml"

lua_script_name = "burst_buffer.lua"

local function quote(s)
	return "'" .. string.gsub(tostring(s), "'", "'\\''") .. "'"
end

-- Run `gpuq-slurm VERB ARGS...`; every line it prints goes to slurmctld's
-- log, the last one back to Slurm (shown in the job's Reason/Comment).
local function gpuq(verb, job_id, ...)
	local cmd = quote(GPUQ_SLURM) .. " --config " .. quote(GPUQ_SLURM_CONFIG) .. " " .. verb
	for _, a in ipairs({ ... }) do
		cmd = cmd .. " " .. quote(a)
	end
	local p = io.popen(cmd .. " 2>&1; echo \"gpuq-slurm-exit=$?\"")
	if p == nil then
		return slurm.ERROR, "gpuq: cannot run " .. GPUQ_SLURM
	end
	local out = p:read("*a") or ""
	p:close()
	local code = tonumber(string.match(out, "gpuq%-slurm%-exit=(%d+)%s*$"))
	out = string.gsub(out, "gpuq%-slurm%-exit=%d+%s*$", "")
	local last = "gpuq-slurm " .. verb .. ": no answer"
	for line in string.gmatch(out, "[^\n]+") do
		slurm.log_info("%s: %s job %s: %s", lua_script_name, verb, tostring(job_id), line)
		last = line
	end
	if code == 0 then
		return slurm.SUCCESS, last
	end
	return slurm.ERROR, last
end

-- At submission: sbatch refuses a script whose request is not valid.
function slurm_bb_job_process(job_script)
	return gpuq("job-process", "-", job_script)
end

-- The pool: one unit (one DAOS job holds the site), none while it is held.
function slurm_bb_pools()
	local p = io.popen(quote(GPUQ_SLURM) .. " --config " .. quote(GPUQ_SLURM_CONFIG) .. " pools 2>/dev/null")
	if p == nil then
		return slurm.ERROR, "gpuq: cannot run " .. GPUQ_SLURM
	end
	local out = p:read("*a") or ""
	p:close()
	if string.match(out, "^{") == nil then
		return slurm.ERROR, "gpuq-slurm pools: no answer"
	end
	return slurm.SUCCESS, out
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	return gpuq("setup", job_id, job_id, uid, gid, job_script)
end

function slurm_bb_data_in(job_id, job_script)
	return gpuq("data-in", job_id, job_id)
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	return gpuq("paths", job_id, job_id, path_file)
end

function slurm_bb_pre_run(job_id, job_script)
	return gpuq("pre-run", job_id, job_id)
end

function slurm_bb_post_run(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	return gpuq("teardown", job_id, job_id)
end

-- `scontrol show bbstat`.
function slurm_bb_get_status(...)
	return gpuq("status", "-")
end
