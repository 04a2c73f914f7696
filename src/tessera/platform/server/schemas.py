"""Request bodies of the API (pydantic), with the bounds a request may ask for, and the run summary
the list answers with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tessera.platform.spec.run_spec import MAX_GPUS_PER_NODE, MAX_RETRIES, validate_name
from tessera.platform.spec.schema import NAME_MAX

# A name's bound is checked by validate_name, whose one-line error names the value and the bound (a
# max_length here would answer first, without the value); the schema still shows it.
NAMED: dict[str, Any] = {"json_schema_extra": {"maxLength": NAME_MAX}}


def _named(what: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        return None if value is None else validate_name(value, what)
    return check


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRun(_Body):
    spec: dict[str, Any] = Field(description="A Tessera run spec, or an MCLI run YAML, as a mapping.")
    cluster: str | None = Field(None, **NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class ClusterChoice(_Body):
    cluster: str | None = Field(None, **NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class MoveRun(_Body):
    cluster: str = Field(**NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class CloneRun(_Body):
    name: str = Field(**NAMED)
    cluster: str | None = Field(None, **NAMED)
    gpus: int | None = Field(None, ge=0, le=MAX_GPUS_PER_NODE)

    _name = field_validator("name")(_named("run name"))
    _cluster = field_validator("cluster")(_named("cluster name"))


class UpdateRun(_Body):
    priority: Literal["low", "normal", "high"] | None = None
    max_duration: float | str | None = Field(None, description="Seconds, or a duration such as '12h'.")
    max_retries: int | None = Field(None, ge=0, le=MAX_RETRIES)

    @field_validator("max_duration")
    @classmethod
    def _short(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str) and len(value) > 32:
            raise ValueError("a duration is at most 32 characters (e.g. '12h', '1h30m')")
        return value


class NewCluster(BaseModel):
    """`{"name", "type", "replace"?, "config"?: {...}}`; other keys are the cluster's config too, as the
    CLI's options are."""
    model_config = ConfigDict(extra="allow")
    name: str = Field(**NAMED)
    type: str = Field(max_length=32)
    replace: bool = False
    config: dict[str, Any] = Field(default_factory=dict)

    _cluster = field_validator("name")(_named("cluster name"))

    def settings(self) -> dict[str, Any]:
        return {**(self.model_extra or {}), **self.config}


class NewSecret(BaseModel):
    """`{"type", "name", "overwrite"?, ...the type's fields}`; a file's bytes come base64 in "content"."""
    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=32)
    name: str = Field(**NAMED)
    overwrite: bool = False

    _secret = field_validator("name")(_named("secret name"))


class NewUser(_Body):
    name: str = Field(**NAMED)
    team: str = Field(**NAMED)
    admin: bool = False

    _name = field_validator("name")(_named("user name"))
    _team = field_validator("team")(_named("team name"))


class NewTeam(_Body):
    name: str = Field(**NAMED)

    _team = field_validator("name")(_named("team name"))

