"""Request bodies of the API (pydantic), with the bounds a request may ask for, and the run summary
the list answers with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tessera.platform.spec import MAX_GPUS_PER_NODE, MAX_RETRIES, validate_name

NAME_MAX = 63


def _name(value: str | None) -> str | None:
    return None if value is None else validate_name(value)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRun(_Body):
    spec: dict[str, Any] = Field(description="A Tessera run spec, or an MCLI run YAML, as a mapping.")
    cluster: str | None = Field(None, max_length=NAME_MAX)

    _cluster = field_validator("cluster")(_name)


class ClusterChoice(_Body):
    cluster: str | None = Field(None, max_length=NAME_MAX)

    _cluster = field_validator("cluster")(_name)


class MoveRun(_Body):
    cluster: str = Field(max_length=NAME_MAX)

    _cluster = field_validator("cluster")(_name)


class CloneRun(_Body):
    name: str = Field(max_length=NAME_MAX)
    cluster: str | None = Field(None, max_length=NAME_MAX)
    gpus: int | None = Field(None, ge=0, le=MAX_GPUS_PER_NODE)

    _names = field_validator("name", "cluster")(_name)


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
    name: str = Field(max_length=NAME_MAX)
    type: str = Field(max_length=32)
    replace: bool = False
    config: dict[str, Any] = Field(default_factory=dict)

    _cluster = field_validator("name")(_name)

    def settings(self) -> dict[str, Any]:
        return {**(self.model_extra or {}), **self.config}


class NewSecret(BaseModel):
    """`{"type", "name", "overwrite"?, ...the type's fields}`; a file's bytes come base64 in "content"."""
    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=32)
    name: str = Field(max_length=NAME_MAX)
    overwrite: bool = False

    _secret = field_validator("name")(_name)


class NewUser(_Body):
    name: str = Field(max_length=NAME_MAX)
    team: str = Field(max_length=NAME_MAX)
    admin: bool = False

    _names = field_validator("name", "team")(_name)


class NewTeam(_Body):
    name: str = Field(max_length=NAME_MAX)

    _team = field_validator("name")(_name)

