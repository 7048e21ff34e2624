"""What the nodes of a cloud pool may do with the buckets its sky.Volume(storage=None) mount.

No keys travel: the nodes act as the pool's own identity, granted exactly the volumes' buckets
and prefixes (least privilege), and only read actions for read-only volumes.

* AWS: an IAM role that EC2 may assume, an inline policy (:func:`aws_policy`) and an instance
  profile the instances carry;
* GCP: each node's service account gets a role on each bucket (``roles/storage.objectViewer``
  read-only, ``roles/storage.objectUser`` read-write), limited to the prefix by an IAM condition
  when the volume has one.

The policy documents are plain data built from the plan, so tests check them without Pulumi.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .plan import BucketPlan, PoolPlan

# rclone reads with these: list the bucket (under the prefix), read objects.
AWS_READ_BUCKET = ("s3:ListBucket", "s3:GetBucketLocation")
AWS_READ_OBJECTS = ("s3:GetObject",)
# ... and writes with these (multipart uploads for large files).
AWS_WRITE_BUCKET = ("s3:ListBucketMultipartUploads",)
AWS_WRITE_OBJECTS = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")
GCP_READ_ROLE = "roles/storage.objectViewer"
GCP_WRITE_ROLE = "roles/storage.objectUser"


def grants(plan: PoolPlan) -> list[BucketPlan]:
    """One grant per (bucket, prefix): read-write wins when two volumes share one."""
    merged: dict[tuple[str, str], bool] = {}
    for b in plan.buckets:
        merged[(b.bucket, b.prefix)] = merged.get((b.bucket, b.prefix), True) and b.read_only
    return [BucketPlan(bucket, prefix, ro) for (bucket, prefix), ro in merged.items()]


def aws_policy(plan: PoolPlan) -> dict[str, Any]:
    """The role's policy document: per volume, list its prefix, read (and maybe write) its objects."""
    statements: list[dict[str, Any]] = []
    for i, g in enumerate(grants(plan)):
        bucket_arn = f"arn:aws:s3:::{g.bucket}"
        objects_arn = f"{bucket_arn}/{g.prefix}/*" if g.prefix else f"{bucket_arn}/*"
        listing: dict[str, Any] = {
            "Sid": f"List{i}", "Effect": "Allow", "Action": list(AWS_READ_BUCKET)
            + ([] if g.read_only else list(AWS_WRITE_BUCKET)), "Resource": [bucket_arn],
        }
        if g.prefix:
            listing["Condition"] = {"StringLike": {"s3:prefix": [g.prefix, f"{g.prefix}/*"]}}
        statements.append(listing)
        statements.append({
            "Sid": f"Objects{i}", "Effect": "Allow",
            "Action": list(AWS_READ_OBJECTS) + ([] if g.read_only else list(AWS_WRITE_OBJECTS)),
            "Resource": [objects_arn],
        })
    return {"Version": "2012-10-17", "Statement": statements}


ASSUME_EC2 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


@dataclass
class AwsAccess:
    role: Any
    policy: Any
    profile: Any


def declare_aws(aws: Any, plan: PoolPlan, res: Any, tags: dict[str, str]) -> AwsAccess | None:
    """The role, its policy and the instance profile (None when no volume needs them)."""
    import json

    if not plan.buckets:
        return None
    name = f"skyward-{plan.stack}"[:64]
    role = aws.iam.Role("nodes-role", name=name, assume_role_policy=json.dumps(ASSUME_EC2),
                        description=f"skyward pool {plan.pool}: its nodes' access to the volumes' buckets",
                        tags=tags, opts=res)
    policy = aws.iam.RolePolicy("nodes-buckets", role=role.id, name="volumes",
                                policy=json.dumps(aws_policy(plan)), opts=res)
    profile = aws.iam.InstanceProfile("nodes-profile", name=name, role=role.name, tags=tags, opts=res)
    return AwsAccess(role, policy, profile)


def gcp_bindings(plan: PoolPlan) -> list[dict[str, Any]]:
    """(bucket, role, condition) per grant: a prefix becomes an IAM condition on object names
    (listing is a bucket-level permission and stays allowed)."""
    out = []
    for g in grants(plan):
        binding: dict[str, Any] = {"bucket": g.bucket, "role": GCP_READ_ROLE if g.read_only else GCP_WRITE_ROLE}
        if g.prefix:
            objects = f"projects/_/buckets/{g.bucket}/objects/{g.prefix}/"
            binding["condition"] = {
                "title": f"skyward prefix {g.prefix}"[:100],
                "description": f"only objects under {g.prefix}/ (and listing the bucket)",
                "expression": (f'resource.name.startsWith("{objects}") || '
                               f'resource.type == "storage.googleapis.com/Bucket"'),
            }
        out.append(binding)
    return out


def declare_gcp(gcp: Any, plan: PoolPlan, node_name: str, member: Any, res: Any,
                checked: dict[str, Any] | None = None) -> list[Any]:
    """One bucket-level IAM member per grant, for one node's service account. ``checked``: the
    buckets already looked up (one lookup per bucket for the whole pool)."""
    import pulumi

    checked = {} if checked is None else checked
    members = []
    for j, binding in enumerate(gcp_bindings(plan)):
        condition = binding.pop("condition", None)
        if condition is not None:
            # Cloud Storage takes IAM Conditions only on buckets with uniform bucket-level access;
            # on one with fine-grained ACLs the grant fails. Look, and say what to do.
            bucket = binding["bucket"]
            if bucket not in checked:
                checked[bucket] = gcp.storage.get_bucket_output(
                    name=bucket, opts=pulumi.InvokeOptions(provider=res.provider)).uniform_bucket_level_access
            condition = checked[bucket].apply(lambda uniform, c=condition, b=bucket: _conditional(uniform, c, b))
        members.append(gcp.storage.BucketIAMMember(
            f"{node_name}-bucket-{j}", member=member, opts=res, **binding,
            **({"condition": condition} if condition is not None else {})))
    return members


def _conditional(uniform: Any, condition: dict[str, Any], bucket: str) -> dict[str, Any]:
    from skyward.errors import ConfigError

    if uniform is False:
        raise ConfigError(
            f"sky.Volume on bucket {bucket!r} with a prefix: the nodes' grant is limited to the prefix by an "
            f"IAM condition, which Cloud Storage accepts only on buckets with uniform bucket-level access, and "
            f"this bucket uses fine-grained ACLs. Enable it (gcloud storage buckets update gs://{bucket} "
            f"--uniform-bucket-level-access), or mount the whole bucket (prefix=''), or give the Volume a "
            f"sky.storage preset with keys."
        )
    return condition
