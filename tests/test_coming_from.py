"""docs/coming-from.md keeps up with README.md: every feature README names (in bold) is in
the guide's tables, and so is every option README's feature bullets show (``rate_limit=``,
``expires=``, ...). A feature added to README without a row in the guide fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GUIDE = (ROOT / "docs" / "coming-from.md").read_text()

#: Each feature README.md names in bold -> what the guide's tables must say of it.
FEATURES: dict[str, tuple[str, ...]] = {
    "once, with valid data": ("validated at enqueue", "at least once"),
    "Brokers:": ("Redis Streams", "Redis Cluster", "SQS", "PostgreSQL", "NATS", "memory://"),
    "Workflows:": ("app.batch(on_complete=", "aqw.Flow()"),
    "Enqueue in your transaction:": ("conn=conn", "outbox"),
    "Fair shares:": ("fairness_key=", "aqw limits set"),
    "partitioned queues": ("partitions=", "partitioned queues"),
    "A lease around every job:": ("a lease around every job", "lease_ttl"),
    "fencing token": ("ctx.fencing_token",),
    "Failures that never run away:": ("RetryPolicy", "max_retries=", "aqw dlq list", "retry_on"),
    "Fast:": ("pipelined round trips", "benchmarks"),
    "A job's whole life": (
        "app.job(job_id)",
        "app.result(job_id",
        "app.cancel(job_id)",
        "expires=",
        "keep_result=True",
    ),
    "Periodic tasks": ("aqw.Cron(", "aqw.Every(", "aqw cron list"),
    "Flow control shared by every worker": (
        "rate_limit=",
        "max_per_key=",
        "priority=",
        "debounce=",
        "--queues",
    ),
    "Idempotency keys": ("key=",),
    "completion records": ("completion records", "ctx.effect(conn)"),
    "Resource locks": ("ctx.lock(",),
    "Redlock": ("Redlock",),
    "Cache helpers": ("aqw.Cache", "invalidates="),
    "OpenTelemetry": ("OpenTelemetry", "aqw.Monitor"),
    "FastAPI": ("aqw.fastapi.lifespan",),
    "web dashboard": ("aqw.dashboard.create_app", "aqw dashboard"),
}

#: Bold text in README.md that names no feature.
NOT_FEATURES = {"Python >= 3.11"}


def table_rows(text: str) -> str:
    """The guide's table rows, one string."""
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def readme_bold() -> set[str]:
    return {" ".join(m.split()) for m in re.findall(r"\*\*(.+?)\*\*", README, re.S)}


def readme_feature_bullets() -> str:
    """README's feature bullets: the list at the top and "Also in the box"."""
    top = README.split("## Install", 1)[0]
    box = README.split("## Also in the box", 1)[1].split("\n## ", 1)[0]
    return top + box


def test_every_feature_readme_names_is_one_the_guide_is_checked_for() -> None:
    named = readme_bold() - NOT_FEATURES
    assert named == set(FEATURES), (
        f"README features missing here (add them, and their rows to docs/coming-from.md): "
        f"{sorted(named - set(FEATURES))}; gone from README: {sorted(set(FEATURES) - named)}"
    )


def test_the_guide_tables_cover_every_feature() -> None:
    rows = table_rows(GUIDE).lower()
    missing = {
        feature: [m for m in markers if m.lower() not in rows]
        for feature, markers in FEATURES.items()
    }
    missing = {feature: markers for feature, markers in missing.items() if markers}
    assert not missing, f"docs/coming-from.md's tables lack: {missing}"


def test_every_option_readmes_features_show_is_in_the_guide() -> None:
    spans = re.findall(r"`([^`]+)`", readme_feature_bullets())
    options = {name for span in spans for name in re.findall(r"\b([a-z_]+)=", span)}
    assert {"rate_limit", "expires", "priority", "partitions"} <= options  # the check bites
    rows = table_rows(GUIDE)
    missing = sorted(name for name in options if not re.search(rf"\b{name}\b", rows))
    assert not missing, f"options README shows that docs/coming-from.md's tables lack: {missing}"


def test_the_guide_names_no_removed_api() -> None:
    assert "job_status" not in GUIDE  # app.job(job_id) is the record
    assert "not yet" not in GUIDE.lower()  # results and cron exist
