"""Schemas of ``GET /sandbox/memory/v1/usage`` (app/services/usage_report.py builds the body)."""

from __future__ import annotations

from marshmallow import Schema, fields


def _count(description: str) -> fields.Integer:
    return fields.Integer(required=True, metadata={"description": description})


class UsageCounts(Schema):
    """What a project (or a tenant: the sum of its projects) stores."""

    tasks = _count("Tasks (an expired task counts until the sweeper removes it).")
    turns = _count("Turns.")
    artifacts = _count("Artifacts.")
    artifact_bytes = _count("Bytes of the artifacts.")
    turn_bytes = _count("Bytes of the turns: each turn's meta as compact JSON plus its summary.")
    stores = _count("Memory stores.")
    memories = _count("Live memories.")
    memory_bytes = _count("Bytes of the live memories' content.")
    versions = _count("Memory versions kept (the history of every memory).")
    version_bytes = _count("Bytes of content the kept versions hold.")
    bytes = _count("What the byte quota counts: turn_bytes + artifact_bytes + version_bytes.")


class Quota(Schema):
    bytes = fields.Integer(
        allow_none=True, required=True, metadata={"description": "Bytes allowed; null: no limit."}
    )
    tasks = fields.Integer(
        allow_none=True, required=True, metadata={"description": "Tasks allowed; null: no limit."}
    )


class ProjectUsage(Schema):
    tenant = fields.String(required=True)
    project = fields.String(required=True)
    usage = fields.Nested(UsageCounts, required=True)
    quota = fields.Nested(Quota, required=True)


class DiskSpace(Schema):
    free_bytes = fields.Integer(required=True)
    floor_bytes = fields.Integer(
        required=True, metadata={"description": "Writes are refused (507) below this."}
    )


class TrafficHour(Schema):
    hour = fields.String(required=True, metadata={"description": "Start of the hour (UTC)."})
    project = fields.String(required=True)
    token_id = fields.String(required=True)
    requests = fields.Integer(required=True)
    bytes_in = fields.Integer(required=True, metadata={"description": "Request body bytes."})
    bytes_out = fields.Integer(required=True, metadata={"description": "Response body bytes."})


class SecretCounts(Schema):
    masked = fields.Integer(
        required=True, metadata={"description": "Secrets masked in the project's writes."}
    )
    masked_by_kind = fields.Dict(keys=fields.String(), values=fields.Integer(), required=True)
    refused_writes = fields.Integer(
        required=True,
        metadata={"description": "Writes refused for the secrets they held (policy reject)."},
    )
    truncated = fields.Boolean(
        required=True,
        metadata={"description": "True when the counts stop short of the period (many events)."},
    )


class UsageReport(Schema):
    tenant = fields.String(required=True)
    project = fields.String(required=True)
    usage = fields.Nested(UsageCounts, required=True)
    quota = fields.Nested(Quota, required=True)
    tenant_usage = fields.Nested(
        UsageCounts, required=True, metadata={"description": "The sum over the tenant's projects."}
    )
    tenant_quota = fields.Nested(Quota, required=True)
    projects = fields.List(
        fields.Nested(ProjectUsage),
        required=True,
        metadata={"description": "Every project of the tenant (tenant_admin and admin tokens)."},
    )
    disk = fields.Nested(
        DiskSpace,
        allow_none=True,
        required=True,
        metadata={"description": "The storage root's disk (admin tokens, the tree only)."},
    )
    traffic = fields.List(
        fields.Nested(TrafficHour),
        required=True,
        metadata={
            "description": "Requests and bytes per hour and token, oldest first: this project's,"
            " or (tenant_admin and admin) every project's of the tenant."
        },
    )
    secrets = fields.Nested(
        SecretCounts,
        required=True,
        metadata={
            "description": "This project's secrets in the same hours (docs/secrets.md), from"
            " its audit log."
        },
    )


OPENAPI_SCHEMAS = (
    UsageCounts,
    Quota,
    ProjectUsage,
    DiskSpace,
    TrafficHour,
    SecretCounts,
    UsageReport,
)
