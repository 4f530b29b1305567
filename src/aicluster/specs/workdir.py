"""The working directory a job carries: a gzip-compressed tar archive, checked at submit.

Invariant: an archive that is accepted unpacks (with tarfile's "data" filter, as the worker
does) to at most MAX_WORKDIR_FILES members and MAX_WORKDIR_UNPACKED bytes, with no member
or link that leaves the working directory. Only the tar headers are trusted for sizes, and
the check stops at the first header past a limit, so a small archive that claims a huge
member costs nothing to refuse.
"""

from __future__ import annotations

import io
import tarfile

from aicluster.specs.limits import MAX_WORKDIR_FILES, MAX_WORKDIR_UNPACKED

_DEST = "/aicluster-workdir"  # any absolute folder: the filter only compares paths


class WorkdirInvalid(ValueError):
    """The archive is not one the worker would unpack safely; the message says why."""


def check_workdir_archive(
    blob: bytes, max_bytes: int = MAX_WORKDIR_UNPACKED, max_files: int = MAX_WORKDIR_FILES
) -> None:
    if blob[:2] != b"\x1f\x8b":
        raise WorkdirInvalid("not a gzip-compressed tar archive (.tar.gz)")
    total = count = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r|gz") as tar:
            for member in tar:
                count += 1
                total += max(member.size, 0)
                if count > max_files:
                    raise WorkdirInvalid(f"more than {max_files} files")
                if total > max_bytes:
                    raise WorkdirInvalid(f"unpacks to more than {max_bytes // 2**20} MiB")
                try:
                    tarfile.data_filter(member, _DEST)
                except tarfile.FilterError as exc:
                    raise WorkdirInvalid(f"{member.name[:200]!r}: {exc}") from None
    except WorkdirInvalid:
        raise
    except Exception as exc:  # noqa: BLE001 - tarfile raises many kinds (even TypeError) on junk
        raise WorkdirInvalid(f"not a valid .tar.gz archive: {exc}") from None
