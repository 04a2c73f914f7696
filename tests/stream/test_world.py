"""The one reading of the job's world (tessera.stream.world): its order of sources, Slurm's count syntax,
and errors that name the variables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.stream import world as world_module
from tessera.stream.world import World, WorldError, env_int, rendezvous, resolve_world, slurm_job


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int]:
    """(rank, world size, ranks per node) of a valid job."""
    per_node = draw(st.integers(1, 8))
    world = per_node * draw(st.integers(1, 4))
    return draw(st.integers(0, world - 1)), world, per_node


def torchrun_vars(rank: int, world: int, per_node: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node)}


def slurm_vars(rank: int, world: int, per_node: int, step: str | None, per_node_var: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
           "SLURM_LOCALID": str(rank % per_node), "SLURM_JOB_NUM_NODES": str(world // per_node),
           "SLURM_JOB_NODELIST": "gpu[07-09]"}
    if per_node_var:  # srun writes the step's layout as "4(x2)"; without it, tasks / nodes
        env[per_node_var] = f"{per_node}(x{world // per_node})"
    if step is not None:
        env["SLURM_STEP_ID"] = step
    return env


steps = st.sampled_from([None, "0", "3", "4294967291", "4294967294", ""])  # batch and extern steps are huge
per_node_vars = st.sampled_from(["", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"])


def in_step(step: str | None) -> bool:
    return step in ("0", "3")


@given(torchrun=st.none() | layouts(), slurm=layouts(), step=steps, per_node_var=per_node_vars,
       explicit=st.none() | layouts())
def test_explicit_then_torchrun_then_an_srun_step_then_one_process(torchrun, slurm, step, per_node_var, explicit):
    env = slurm_vars(*slurm, step, per_node_var)
    if torchrun is not None:
        env.update(torchrun_vars(*torchrun))
    if explicit is not None:
        rank, world, per_node = explicit
        got = resolve_world(env, rank=rank, world_size=world, local_rank=rank % per_node, local_world_size=per_node)
        expected = explicit
    else:
        got = resolve_world(env)
        expected = torchrun or (slurm if in_step(step) else (0, 1, 1))
    rank, world, per_node = expected
    assert got == World(rank, world, rank % per_node, per_node)
    assert world_module.world_source(env) == ("torchrun" if torchrun else "slurm" if in_step(step) else "single")


@given(slurm=layouts(), step=steps, per_node_var=per_node_vars, nodelist=st.sampled_from(["", "gpu[07-09]", "a"]))
def test_a_shell_in_an_allocation_is_one_process_whatever_slurm_ntasks_says(slurm, step, per_node_var, nodelist):
    """salloc and sbatch without srun: SLURM_NTASKS counts the allocation's tasks, not processes."""
    env = slurm_vars(*slurm, None if in_step(step) else step, per_node_var)
    env["SLURM_JOB_NODELIST"] = nodelist
    assert resolve_world(env) == World()
    assert rendezvous(env) == ("127.0.0.1", 29500)


@given(torchrun=layouts(), slurm=layouts(), step=steps, per_node_var=per_node_vars)
def test_torchrun_decides_as_a_whole_never_mixed_with_slurm(torchrun, slurm, step, per_node_var):
    """`srun tessera launch`: the launcher task's SLURM_PROCID/SLURM_LOCALID are not the worker's."""
    env = {**slurm_vars(*slurm, step, per_node_var), "RANK": str(torchrun[0]), "WORLD_SIZE": str(torchrun[1])}
    rank, world, _ = torchrun
    assert resolve_world(env) == World(rank, world, rank, world)  # no LOCAL_*: one node, not Slurm's nodes


def test_an_srun_step_reads_slurm_and_its_rendezvous():
    env = slurm_vars(3, 8, 4, "0", "SLURM_NTASKS_PER_NODE")
    assert resolve_world(env) == World(3, 8, 3, 4)
    assert rendezvous(env) == ("gpu07", 24242)
    assert rendezvous({**env, "MASTER_ADDR": "h", "MASTER_PORT": "1234"}) == ("h", 1234)
    env.update(SLURM_STEP_NUM_TASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_LOCALID="1")
    assert resolve_world(env) == World(3, 4, 1, 2)  # a step of 4 tasks inside an allocation of 8


@pytest.mark.parametrize("env, names", [
    ({"RANK": "5", "WORLD_SIZE": "4"}, ["RANK=5", "WORLD_SIZE=4", "torchrun"]),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "6", "SLURM_NTASKS_PER_NODE": "4"},
     ["SLURM_NTASKS=6", "SLURM_NTASKS_PER_NODE=4", "slurm"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, ["LOCAL_RANK=3"]),
    ({"WORLD_SIZE": "four"}, ["WORLD_SIZE='four'"]),
])
def test_a_bad_world_names_the_variables(env, names):
    with pytest.raises(WorldError) as err:
        resolve_world(env)
    assert all(name in str(err.value) for name in names), str(err.value)


@given(count=st.integers(-10, 10**6), nodes=st.none() | st.integers(1, 99), more=st.booleans())
def test_slurm_counts_read_as_their_first_number(count, nodes, more):
    value = str(count) + (f"(x{nodes})" if nodes else "") + (",3" if more else "")
    assert env_int({"N": value}, "N") == count


@given(st.text(max_size=12))
def test_any_text_is_a_number_or_an_error_naming_the_variable(value):
    try:
        got = env_int({"SOME_VAR": value}, "SOME_VAR")
    except WorldError as exc:
        assert "SOME_VAR=" in str(exc)
    else:
        assert got is None if not value.strip() else isinstance(got, int)


def test_slurm_job_as_a_launcher_sees_it():
    assert slurm_job({}) is None
    job = slurm_job({"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_NODELIST": "n[1-3]",
                     "SLURM_GPUS_PER_NODE": "a100:4"})
    assert job is not None
    assert (job.nodes, job.node_id, job.master_host, job.gpus_on_node, job.master_port) == (3, 2, "n1", 4, 20007)
