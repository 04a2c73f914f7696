"""The GraphQL input types MCLI's operations declare (`GetRunsPaginatedInput!`, `CreateRunInput!`, ...), with
every field the client sends. Filters are typed, so a filter Tessera does not know is refused by the
schema (one error naming it) instead of silently widening a stop or a delete."""

from __future__ import annotations

import strawberry
from strawberry.scalars import JSON


@strawberry.input
class StringFilter:
    in_: list[str] | None = strawberry.field(name="in", default=None)


@strawberry.input
class IntFilter:
    in_: list[int] | None = strawberry.field(name="in", default=None)


@strawberry.input
class DateFilter:
    """ISO 8601 times: created (or ended) before `lt`, at or after `gte`."""
    lt: str | None = None
    gte: str | None = None


@strawberry.input
class HasFilter:
    has: str | None = None


@strawberry.input
class EntityInput:
    """Whose objects (MCLI's admin mode). A key sees its own team: `emails` filters by user name."""
    user_ids: list[str] | None = None
    organization_ids: list[str] | None = None
    emails: list[str] | None = None


@strawberry.input
class RunFilters:
    name: StringFilter | None = None
    status: StringFilter | None = None
    cluster_name: StringFilter | None = None
    gpu_type: StringFilter | None = None
    gpu_num: IntFilter | None = None
    run_type: StringFilter | None = None
    created_at: DateFilter | None = None
    ended_at: DateFilter | None = None


@strawberry.input
class GetRunsInput:
    filters: RunFilters | None = None
    entity: EntityInput | None = None
    include_deleted: bool | None = None


@strawberry.input
class GetRunsPaginatedInput:
    filters: RunFilters | None = None
    entity: EntityInput | None = None
    include_deleted: bool | None = None
    limit: int | None = None
    cursor: str | None = None


@strawberry.input
class CreateRunInput:
    run_input: JSON
    entity: EntityInput | None = None


@strawberry.input
class StopRunsInput:
    reason: str | None = None


@strawberry.input
class UpdateRunInput:
    priority: str | None = None
    max_retries: int | None = None
    preemptible: bool | None = None
    retry_on_system_failure: bool | None = None
    max_duration_seconds: int | None = None


@strawberry.input
class GetRunLogsInput:
    name: str
    follow: bool | None = None
    failed: bool | None = None
    exception_only: bool | None = None
    node_rank: int | None = None
    local_gpu_rank: int | None = None
    global_gpu_rank: int | None = None
    attempt_index: int | None = None
    tail: int | None = None
    container_name: str | None = None
    offset: int | None = None
    entity: EntityInput | None = None


@strawberry.input
class WatchRunStatusInput:
    name: str
    entity: EntityInput | None = None


@strawberry.input
class ClusterFilters:
    name: StringFilter | None = None
    allowed_submission_types: HasFilter | None = None


@strawberry.input
class GetClustersInput:
    filters: ClusterFilters | None = None
    include_all: bool | None = None
    entity: EntityInput | None = None


@strawberry.input
class SecretFilters:
    name: StringFilter | None = None
    type: StringFilter | None = None


@strawberry.input
class GetSecretsInput:
    filters: SecretFilters | None = None
    entity: EntityInput | None = None


@strawberry.input
class CreateSecretInput:
    """One of MCLI's secret kinds, as `{name, metadata?, value}`."""
    env_var_secret: JSON | None = None
    mounted_secret: JSON | None = None
    docker_registry_secret: JSON | None = None
    s3_secret: JSON | None = strawberry.field(name="s3Secret", default=None)
    ssh_secret: JSON | None = None
    git_ssh_secret: JSON | None = strawberry.field(name="gitSSHSecret", default=None)
    sftp_ssh_secret: JSON | None = strawberry.field(name="sftpSSHSecret", default=None)
    gcp_secret: JSON | None = None
    oci_secret: JSON | None = None
    databricks_secret: JSON | None = None
    entity: EntityInput | None = None


@strawberry.input
class GetUsersInput:
    filters: JSON | None = None
    entity: EntityInput | None = None
