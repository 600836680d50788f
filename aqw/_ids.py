"""Identifiers and clocks shared across modules."""

from __future__ import annotations

import os
import socket
import time
import uuid


def new_job_id() -> str:
    """A random, URL- and key-safe job id (UUID4 hex)."""
    return uuid.uuid4().hex


def new_token() -> str:
    """A random lease token; only its holder knows it."""
    return os.urandom(16).hex()


def consumer_name() -> str:
    """A name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def now() -> float:
    """Wall-clock seconds since the epoch (for timestamps stored in messages)."""
    return time.time()
