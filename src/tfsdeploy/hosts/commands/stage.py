"""Staging a model version on a host (pure argv builders).

The upload is a tar holding ``version/`` (the SavedModel files) and ``SHA256SUMS`` beside it
(so a model file may itself be called SHA256SUMS). It is unpacked into a hidden staging
directory, owned by the deploying user (root on a usual fleet) with modes 0644/0755 whatever
the files had on the deploying machine, checked, fsynced, then published with one rename:
TFServing loads a version directory the moment it appears, so it only ever appears whole (and
survives a power loss whole). A failed check removes the staging directory. Beside the version, the
host keeps its digest, the boot id it was staged under and its sums (``versions/``), so that
a reuse after a reboot verifies every file again first.
"""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.files import SYNC, publish_sh

_EXTRACT = ('rm -rf -- "$2" && mkdir -p -m 0755 -- "$2" && '
            'tar --no-same-owner --no-same-permissions -xf "$1" -C "$2" && rm -f -- "$1" && '
            'chmod -R u=rwX,go=rX -- "$2" || { rm -rf -- "$2" "$1"; exit 1; }')

# the host kernel's boot id: a staged version's files are trusted across a reboot only after
# they were verified again (a power loss can leave them short whatever was fsynced after)
_BOOT = 'boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null); '

# a shell function: record DIGEST_FILE DIGEST SUMS writes "<digest> <boot id>" to the digest
# file and the sums beside it, durably
_RECORD = ('record() { mkdir -p -- "$(dirname -- "$1")" && ' + _BOOT
           + 'cp -- "$3" "${1%.sha256}.sums.tmp" && '
           + publish_sh('"${1%.sha256}.sums.tmp"', '"${1%.sha256}.sums"') + ' && '
           'printf "%s %s\\n" "$2" "$boot" > "$1.tmp" && '
           + publish_sh('"$1.tmp"', '"$1"') + '; }; ')

# exit 0 and "published" or "exists"; exit 5 when a checksum does not match. Every file and
# directory of the new version is fsynced before its one rename, the models directory after
# it. "replace": a damaged version already there is moved aside (into the staging directory,
# removed with it) just before that rename: two renames apart, never a half version.
_PUBLISH = (_RECORD + 'cd "$1" || exit 1; '
            'if [ "$6" != checked ] && ! (cd version && sha256sum --quiet --check ../SHA256SUMS); '
            'then '
            'cd /; rm -rf -- "$1"; exit 5; fi; cd /; '
            'record "$3" "$4" "$1/SHA256SUMS" || exit 1; '
            'models=$(dirname -- "$2"); '
            f'find "$1/version" -exec {SYNC} {{}} + && {SYNC} "$models" || exit 1; '
            'if [ "$5" = replace ] && [ -e "$2" ]; then mv -T -- "$2" "$1/damaged" || exit 1; fi; '
            'if [ -e "$2" ]; then rm -rf -- "$1"; echo exists; '
            'else mv -T -- "$1/version" "$2" && ' + f'{SYNC} "$models"'
            ' && rm -rf -- "$1" && echo published; fi')

# exit 0 when the existing version holds exactly the files of the sums "$1"; 5 when it differs
_VERIFY = (_RECORD + 'cd "$2" || exit 1; '
           'n=$(find . -type f | wc -l); want=$(grep -c "" "$1"); '
           'if [ "$n" != "$want" ] || ! sha256sum --quiet --check "$1" >/dev/null 2>&1; then '
           'rm -f -- "$1"; exit 5; fi; '
           'record "$3" "$4" "$1"; code=$?; rm -f -- "$1"; exit $code')

# exit 0 when the version's files match the sums recorded at staging ("$2"; stdin when "$2" is
# empty) and those sums are the recorded digest's ("$3"); 5 when anything differs or is
# missing. Reads only. ($(...) drops the sums' last newline; printf puts it back.)
_VERIFY_RECORDED = ('if [ -n "$2" ]; then sums=$(cat -- "$2") || exit 5; else sums=$(cat); fi; '
                    '[ "$(printf "%s\\n" "$sums" | sha256sum | cut -c1-64)" = "$3" ] || exit 5; '
                    'cd "$1" || exit 5; '
                    'n=$(find . -type f | wc -l); '
                    'want=$(printf "%s\\n" "$sums" | grep -c ""); [ "$n" = "$want" ] && '
                    'printf "%s\\n" "$sums" | sha256sum --quiet --check - >/dev/null 2>&1 '
                    '|| exit 5')


def extract(archive: str, staging: str) -> Argv:
    """Unpack an uploaded archive into a fresh staging directory, then delete the archive
    (both are removed when unpacking fails)."""
    return ["sh", "-c", _EXTRACT, "sh", archive, staging]


def verify_and_publish(staging: str, final: str, *, digest_file: str, digest: str,
                       replace: bool = False, checked: bool = False) -> Argv:
    """Check the staged files against their sums, record the version's digest, sums and the
    boot id, then rename ``staging/version`` to ``final`` (durably) unless a version
    directory is already there: an existing, possibly live, version directory is never
    touched, unless ``replace`` (a version whose files failed their re-verification).
    ``checked``: the files were verified just before (``commands.pull.verify_pulled``), so
    they are not read again."""
    return ["sh", "-c", _PUBLISH, "sh", staging, final, digest_file, digest,
            "replace" if replace else "keep"] + (["checked"] if checked else [])


def verify_existing(sums: str, final: str, *, digest_file: str, digest: str) -> Argv:
    """Check that an already staged version holds exactly the files of ``sums`` (uploaded
    beside it); on success record its digest, those sums and the boot id."""
    return ["sh", "-c", _VERIFY, "sh", sums, final, digest_file, digest]


def verify_recorded(final: str, *, sums_file: str, digest: str) -> Argv:
    """Exit 0 when a staged version holds exactly the files of the sums recorded at staging
    (whose sha256 is ``digest``), 5 otherwise: the check before a version staged during
    another boot of the host is trusted. ``sums_file`` empty: the sums come on stdin (a
    version staged before sums were recorded, checked against the source's, whose digest is
    the recorded one). Changes nothing."""
    return ["sh", "-c", _VERIFY_RECORDED, "sh", final, sums_file, digest]


def record_boot(digest_file: str, digest: str) -> Argv:
    """Record that the staged version of ``digest`` was verified under this boot."""
    return ["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && ' + _BOOT
            + 'printf "%s %s\\n" "$2" "$boot" > "$1.tmp" && ' + publish_sh('"$1.tmp"', '"$1"'),
            "sh", digest_file, digest]
