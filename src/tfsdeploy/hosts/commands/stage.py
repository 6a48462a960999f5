"""Staging a model version on a host (pure argv builders).

The upload is a tar holding ``version/`` (the SavedModel files) and ``SHA256SUMS`` beside it
(so a model file may itself be called SHA256SUMS). It is unpacked into a hidden staging
directory, owned by the deploying user (root on a usual fleet) with modes 0644/0755 whatever
the files had on the deploying machine, checked, then published with one rename: TFServing
loads a version directory the moment it appears, so it only ever appears whole. A failed check
removes the staging directory.
"""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv

_EXTRACT = ('rm -rf -- "$2" && mkdir -p -m 0755 -- "$2" && '
            'tar --no-same-owner --no-same-permissions -xf "$1" -C "$2" && rm -f -- "$1" && '
            'chmod -R u=rwX,go=rX -- "$2" || { rm -rf -- "$2" "$1"; exit 1; }')

# exit 0 and "published" or "exists"; exit 5 when a checksum does not match
_PUBLISH = ('cd "$1" || exit 1; '
            'if ! (cd version && sha256sum --quiet --check ../SHA256SUMS); then '
            'cd /; rm -rf -- "$1"; exit 5; fi; cd /; '
            'mkdir -p -- "$(dirname "$3")" && printf "%s\\n" "$4" > "$3.tmp" && '
            'mv -f "$3.tmp" "$3"; '
            'if [ -e "$2" ]; then rm -rf -- "$1"; echo exists; '
            'else mv -T -- "$1/version" "$2" && rm -rf -- "$1" && echo published; fi')

# exit 0 when the existing version holds exactly the files of the sums; 5 when it differs
_VERIFY = ('cd "$2" || exit 1; '
           'n=$(find . -type f | wc -l); want=$(grep -c "" "$1"); '
           'if [ "$n" != "$want" ] || ! sha256sum --quiet --check "$1" >/dev/null 2>&1; then '
           'rm -f -- "$1"; exit 5; fi; rm -f -- "$1"; '
           'mkdir -p -- "$(dirname "$3")" && printf "%s\\n" "$4" > "$3.tmp" && mv -f "$3.tmp" "$3"')


def extract(archive: str, staging: str) -> Argv:
    """Unpack an uploaded archive into a fresh staging directory, then delete the archive
    (both are removed when unpacking fails)."""
    return ["sh", "-c", _EXTRACT, "sh", archive, staging]


def verify_and_publish(staging: str, final: str, *, digest_file: str, digest: str) -> Argv:
    """Check the staged files against their sums, record the version's digest, then rename
    ``staging/version`` to ``final`` unless a version directory is already there (an
    existing, possibly live, version directory is never touched)."""
    return ["sh", "-c", _PUBLISH, "sh", staging, final, digest_file, digest]


def verify_existing(sums: str, final: str, *, digest_file: str, digest: str) -> Argv:
    """Check that an already staged version holds exactly the files of ``sums`` (uploaded
    beside it); on success record its digest."""
    return ["sh", "-c", _VERIFY, "sh", sums, final, digest_file, digest]
