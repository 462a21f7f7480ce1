"""Search a live process's writable memory for byte strings (Linux /proc; needs ptrace rights)."""

from __future__ import annotations


def find_in_process(pid: int, needles: list[bytes]) -> set[bytes]:
    """The needles present in ``pid``'s private writable or anonymous mappings (heap, stacks, arenas)."""
    found: set[bytes] = set()
    overlap = max(len(n) for n in needles) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            perms, path = fields[1], fields[5] if len(fields) > 5 else ""
            if "r" not in perms or path in ("[vvar]", "[vsyscall]", "[vdso]"):
                continue
            if "w" not in perms and path:
                continue  # read-only file mappings: code and constants, not runtime data
            start, end = (int(x, 16) for x in fields[0].split("-"))
            tail = b""
            for pos in range(start, end, 1 << 24):
                try:
                    mem.seek(pos)
                    chunk = tail + mem.read(min(1 << 24, end - pos))
                except (OSError, ValueError):
                    break
                found.update(n for n in needles if n in chunk)
                tail = chunk[-overlap:] if overlap else b""
    return found
