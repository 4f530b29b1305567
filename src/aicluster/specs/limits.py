"""Upper bounds on what a user may ask for, so that every accepted value is one the
platform can store, schedule and show (nothing non-finite, nothing past 64 bits)."""

from __future__ import annotations

INT64_MAX = 2**63 - 1  # SQLite INTEGER and most JSON consumers stop here

MAX_CPUS = 4096  # per worker / replica
MAX_GPUS = 1024  # per worker / replica
MAX_MEMORY = 2**50  # bytes per worker / replica (1 PiB)

MAX_COMMAND_BYTES = 64 * 2**10  # a shell command, or all argv items together
MAX_ARGV_ITEMS = 4096
MAX_ENV_VARS = 1024
MAX_ENV_VALUE = 64 * 2**10
MAX_TEXT = 4096  # model names, paths, artifact references, option values
MAX_LIST = 256  # job inputs and outputs, engine arguments, routing options

MAX_SECONDS = 10 * 365 * 24 * 3600.0  # timeouts and delays: ten years is "never"

# A request to the gateway's OpenAI routes (long prompts; the API and the gateway share it).
MAX_OPENAI_BODY_BYTES = 16 * 2**20

# The uploaded working directory (a gzip-compressed tar archive).
MAX_WORKDIR_BYTES = 64 * 2**20  # compressed, as sent
MAX_WORKDIR_UNPACKED = 2**30  # the sum of the members' sizes
MAX_WORKDIR_FILES = 100_000
