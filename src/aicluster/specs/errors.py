"""The one error type a bad spec raises: a list of (field path, line, message)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpecIssue:
    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.field}: {self.message}"


@dataclass
class SpecError(Exception):
    source: str
    issues: list[SpecIssue] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"invalid spec {self.source}:"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "issues": [
                {"field": i.field, "line": i.line, "message": i.message} for i in self.issues
            ],
        }
