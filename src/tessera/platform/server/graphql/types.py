"""The GraphQL object types MCLI's queries select, field for field (names as MosaicML's API spells them).

Every field an operation of `mosaicml-cli` 0.8.3 asks for is here, because GraphQL refuses a query that
selects an unknown field: runs with their resumptions ("executions") and details, clusters with their
instances and utilization, secrets, and the chunks of the log subscription. Times are ISO 8601 strings
with a time zone, as the client's `datetime.fromisoformat` reads them.
"""

from __future__ import annotations

import strawberry
from strawberry.scalars import JSON


@strawberry.type
class Resumption:
    """One start of a run (MCLI's "execution")."""
    cluster_name: str
    cpus: int
    gpu_type: str
    gpus: int
    nodes: int
    execution_index: int
    start_time: str | None
    end_time: str | None
    status: str
    estimated_end_time: str | None
    reason: str | None


@strawberry.type
class Lifecycle:
    execution_index: int
    status: str
    start_time: str
    end_time: str | None
    reason: str | None


@strawberry.type
class RunNode:
    rank: int
    name: str
    status: str
    reason: str | None


@strawberry.type
class RunEvent:
    resumption_index: int
    event_type: str
    event_time: str
    event_message: str


@strawberry.type
class RunDetails:
    image: str | None
    original_run_input: JSON
    metadata: JSON
    last_execution_id: str | None
    lifecycle: list[Lifecycle]
    nodes: list[RunNode]
    formatted_run_events: list[RunEvent]


@strawberry.type
class Run:
    id: strawberry.ID
    name: str
    status: str
    created_at: str
    updated_at: str
    reason: str | None
    created_by_email: str
    priority: str
    max_retries: int | None
    preemptible: bool
    retry_on_system_failure: bool
    max_duration_seconds: int | None
    is_deleted: bool
    run_type: str
    resumptions: list[Resumption]
    details: RunDetails


@strawberry.type
class RunsPage:
    cursor: str | None
    has_next_page: bool
    runs: list[Run]


@strawberry.type
class UpTime:
    start_date: str | None
    end_date: str | None


@strawberry.type
class ClusterNode:
    name: str
    is_alive: bool
    is_schedulable: bool
    up_time: UpTime | None


@strawberry.type
class Instance:
    """Nodes of one shape (GPU type and count, CPUs) on a cluster."""
    name: str
    gpu_type: str
    gpus_per_node: int
    cpus: int | None
    memory: str
    storage: str
    gpu_nums: list[int]
    num_nodes: int
    nodes: list[ClusterNode]


@strawberry.type
class InstanceUtilization:
    instance: Instance
    cluster_id: str
    gpus_used: int
    gpus_available: int
    gpus_total: int


@strawberry.type
class RunScheduling:
    priority: str
    retry_on_system_failure: bool
    preemptible: bool


@strawberry.type
class RunUtilization:
    id: str
    created_at: str
    user_name: str
    run_name: str
    instance: str
    gpu_num: int
    gpu_type: str
    estimated_end_time: str | None
    max_duration_seconds: int | None
    start_time: str | None
    reason: str | None
    scheduling: RunScheduling


@strawberry.type
class DeploymentUtilization:
    """Inference deployments: Tessera has none, so these lists are always empty."""
    id: str
    created_at: str
    user_name: str
    deployment_name: str
    instance: str
    gpu_num: int


@strawberry.type
class ClusterUtilization:
    instance_utils: list[InstanceUtilization]
    active_runs_by_user: list[RunUtilization]
    queued_runs_by_user: list[RunUtilization]
    active_deployments_by_user: list[DeploymentUtilization]
    queued_deployments_by_user: list[DeploymentUtilization]


@strawberry.type
class Cluster:
    id: str
    name: str
    provider: str
    allow_fractional: bool
    allow_multinode: bool
    allowed_submission_types: list[str]
    is_multi_tenant: bool
    reservation_type: str | None
    scheduler_enabled: bool
    allowed_instances: list[Instance]
    utilization: ClusterUtilization


@strawberry.type
class Secret:
    """A secret's name, MCLI type and what it exposes (metadata); never its value."""
    id: str
    name: str
    type: str
    metadata: JSON
    created_at: str


@strawberry.type
class LogChunk:
    """Log bytes, base64, and the byte offset in the whole log where they end (the client resumes there)."""
    chunk: str
    end_offset: int


@strawberry.type
class Organization:
    """A Tessera team, as MCLI's organization."""
    id: str
    name: str
    is_databricks_internal: bool


@strawberry.type
class User:
    id: str
    name: str
    email: str
    organizations: list[Organization]
