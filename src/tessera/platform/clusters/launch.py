"""Starts one node of a run. Copied into each resumption folder and run there with any Python 3 (it
imports nothing from Tessera), once per node: by the local backend directly, on Slurm by `srun`.

    python launch.py            (in the resumption folder's parent process environment)

It reads launch.json beside it, adds secrets.json (if present) to the command's environment, runs the
prelude (the run's set-up steps: GPU pre-flight, git clone, pip install; each one's output goes to the
node's log, and the first that fails ends the node with {"reason": ...} in node-R.exit and an `error:`
line the failure classifier reads), writes node-R.start, runs the command (through torchrun when there
are several ranks per node), waits for it and for whatever it left in the process group, and writes
node-R.exit = {"exit_code", "signal", ...}.
SIGTERM and SIGINT do not stop this launcher: it relays them to every process of its group (the command
and what it started; Slurm's `scancel --signal` reaches only the task's own process) and waits for them.
"""

import collections
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_json(path, body):
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(body, out)
    os.replace(tmp, path)


def _group_members(pgid, me):
    """Other live (non-zombie) processes in process group `pgid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _become_subreaper():
    """Orphaned descendants (a worker whose shell died) become our children, so we learn how they end."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _decode(status):
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reap_group(pgid, me, wait_seconds, code):
    """Wait up to `wait_seconds` for the rest of the group, then SIGKILL what is left. Returns the exit
    code of the last descendant reaped (the worker that outlived its shell), else `code`."""
    deadline = time.monotonic() + wait_seconds
    while _group_members(pgid, me) and time.monotonic() < deadline:
        code, _ = _reap_some(code)
        time.sleep(0.05)
    for pid in _group_members(pgid, me):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    # A killed multi-threaded worker shows as a zombie before its last thread has exited, and cannot be
    # reaped until then: wait for the children themselves, not for the group to look empty.
    deadline = time.monotonic() + 5
    while True:
        code, children_left = _reap_some(code)
        if not children_left or time.monotonic() > deadline:
            return code
        time.sleep(0.02)


def _reap_some(code):
    """Reap every child that has ended; returns (exit code of the last one, whether any child is left)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code, False
        if pid == 0:
            return code, True
        code = _decode(status)


def _fill(text, rank):
    """Placeholders the platform cannot know when it writes launch.json: this node's python and rank."""
    return text.replace("{python}", sys.executable).replace("{folder}", HERE).replace("{rank}", str(rank))


def _run_step(step, env, workdir, rank):
    """One prelude step; its output goes to this node's log. Returns (exit code, last line it printed)."""
    argv = [_fill(a, rank) for a in step["argv"]]
    step_env = dict(env)
    for key, value in (step.get("env_default") or {}).items():
        step_env.setdefault(key, _fill(value, rank))
    step_env.update({key: _fill(value, rank) for key, value in (step.get("env") or {}).items()})
    cwd = HERE if step.get("cwd") is None else os.path.join(workdir, step["cwd"])
    shown = step.get("show") or " ".join(shlex.quote(a) for a in argv)
    print(f"tessera: {step['name']}: $ {_fill(shown, rank)}", flush=True)
    lock = open(os.path.join(HERE, "prelude.lock"), "a") if step.get("lock") else None
    if lock is not None:   # nodes sharing one environment (Slurm) install into it one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=step_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    except OSError as exc:
        if lock is not None:
            lock.close()
        return 127, f"cannot start {argv[0]}: {exc.strerror or exc}"
    tail = collections.deque(maxlen=20)
    for line in proc.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        if line.strip():
            tail.append(line.decode(errors="replace").strip())
    code = proc.wait()
    if lock is not None:
        lock.close()
    return code, (tail[-1] if tail else "")


def _end_before_command(rank, node, exit_code, sig, **extra):
    _write_json(os.path.join(HERE, f"node-{rank}.exit"),
                {"rank": rank, "node": node, "exit_code": exit_code, "signal": sig, "time": time.time(), **extra})
    return exit_code


def _prelude(cfg, env, workdir, rank, node, stopping):
    """Run the prelude steps in order; None when all succeeded and no stop came, else the exit code the
    node ends with (node-R.exit written, with the reason)."""
    for step in cfg.get("prelude") or []:
        if stopping:
            break
        code, last = _run_step(step, env, workdir, rank)
        if code == 0 or stopping:
            continue
        sig = -code if code < 0 else None
        exit_code = 128 + sig if sig else code
        reason = f"{step['name']} failed: {last or 'no output'} (exit {exit_code})"
        print(f"error: {reason}", flush=True)
        return _end_before_command(rank, node, exit_code, sig, reason=reason, step=step["name"],
                                   node_fault=code == step.get("fault_exit"))
    if stopping:
        sig = stopping[0]
        return _end_before_command(rank, node, 128 + sig, sig, reason="stopped before the command started")
    return None


def main():
    with open(os.path.join(HERE, "launch.json")) as f:
        cfg = json.load(f)
    env = dict(os.environ)
    secrets = os.path.join(HERE, "secrets.json")
    if os.path.exists(secrets):
        with open(secrets) as f:
            env.update(json.load(f))
    rank = int(env.get("SLURM_NODEID") or env.get("NODE_RANK") or 0)
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("NNODES") or 1)
    env.update(NODE_RANK=str(rank), NNODES=str(nnodes))
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    procs = int(cfg.get("procs_per_node", 1))
    command = ["bash", os.path.join(HERE, "command.sh")]
    if procs > 1:
        command = [*cfg["torchrun"], f"--nnodes={nnodes}", f"--node-rank={rank}", f"--nproc-per-node={procs}",
                   f"--master-addr={env.get('MASTER_ADDR', '127.0.0.1')}",
                   f"--master-port={env.get('MASTER_PORT', '29500')}",
                   f"--log-dir={os.path.join(HERE, f'torchrun-{rank}')}", "--tee=3", "--no-python", *command]
    else:
        env.update(RANK=str(rank), WORLD_SIZE=str(nnodes), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   GROUP_RANK=str(rank))
    _become_subreaper()
    me = os.getpid()
    if os.getpgid(0) != me:
        os.setpgid(0, 0)      # own process group, so relaying and clean-up touch only this node's command
    pgid = me

    stopping = []    # set once a stop arrives: no further prelude step, no command

    def relay(signum, _frame):
        stopping.append(signum)
        for pid in _group_members(pgid, me):
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)   # a handler, not SIG_IGN: the command must not inherit an ignored signal
    for note in cfg.get("notes") or []:
        print(note, flush=True)
    workdir = _fill(cfg.get("workdir") or os.getcwd(), rank)
    os.makedirs(workdir, exist_ok=True)
    ended = _prelude(cfg, env, workdir, rank, node, stopping)
    if ended is not None:
        return ended
    try:
        child = subprocess.Popen(command, env=env, cwd=workdir)
    except OSError as exc:
        print(f"tessera: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        _write_json(os.path.join(HERE, f"node-{rank}.exit"),
                    {"rank": rank, "node": node, "exit_code": 127, "signal": None, "time": time.time()})
        return 127
    _write_json(os.path.join(HERE, f"node-{rank}.start"),
                {"rank": rank, "node": node, "pid": child.pid, "launcher_pid": me, "time": time.time()})
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    sig = -code if code < 0 else (code - 128 if code > 128 and code - 128 < 65 else None)
    exit_code = 128 + sig if code < 0 else code
    # A shell killed by SIGTERM leaves the real worker (e.g. checkpointing on SIGTERM) running: give it
    # the grace period, and report how it ended. After a normal exit, leftovers are cleaned up promptly.
    if sig:
        exit_code = _reap_group(pgid, me, float(cfg.get("grace", 30)), exit_code)
        sig = exit_code - 128 if exit_code > 128 else None
    else:
        _reap_group(pgid, me, 2.0, exit_code)
    if exit_code != 0 and not stopping:
        for step in cfg.get("postmortem") or []:   # e.g. the GPU Xids the kernel logged: into this log
            _run_step(step, env, workdir, rank)
    _write_json(os.path.join(HERE, f"node-{rank}.exit"),
                {"rank": rank, "node": node, "exit_code": exit_code, "signal": sig, "time": time.time()})
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
