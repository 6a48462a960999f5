"""Staging a model version by pulling its image (model_transfer pull; pure argv builders).

The host's engine pulls the image by digest (it verifies every blob against its digest, so a
blob whose bytes changed in the registry is refused there), then the version's files are
copied out of a created, never started, container into a hidden staging directory beside the
versions (``.pull-<version>``: not a number, so TFServing never loads it), checked against
the sums the deploy machine computed from the model's source (every file present, none extra,
every sha256 equal), and published with the push path's one rename (``commands.stage``).
A pull or copy cut short leaves at most the staging directory, which the next attempt
removes first, and (the deploy machine killed between ``docker create`` and ``docker rm``) a
created, never started, extract container, labelled with its model: `fab prune` removes both
(``leftovers``, ``remove_leftovers``), with a killed push's ``.staging-*`` and ``.sums-*``.
"""

from __future__ import annotations

from tfsdeploy.hosts.commands import Argv
from tfsdeploy.hosts.commands.files import SYNC

NO_SPACE = 6  # exit code of free_space when a filesystem lacks room
MISMATCH = 5  # exit code of verify_pulled when the files differ from the sums

# "$1" directory that will hold the version, "$2" KiB it needs there, "$3" KiB the image needs
# in the engine's root directory (both filesystems may be one: then their sum); df's
# 1024-byte blocks, in the shell's integers (awk would print large numbers as floats)
_FREE = ('free() { df -Pk -- "$1" | awk \'NR == 2 { print $4 }\'; }; '
         'dev() { df -P -- "$1" | awk \'NR == 2 { print $1 }\'; }; '
         'mkdir -p -- "$1" || exit 1; '
         'root=$(docker info --format "{{.DockerRootDir}}" 2>/dev/null) || root=/var/lib/docker; '
         '[ -d "$root" ] || root=/; '
         'need=$2; if [ "$(dev "$1")" = "$(dev "$root")" ]; then need=$(($2 + $3)); fi; '
         'have=$(free "$1"); '
         'if [ "$have" -lt "$need" ]; then echo "no space: $1 has $((have / 1024)) MiB '
         'free, the version needs $((need / 1024 + 1)) MiB"; exit 6; fi; '
         'have=$(free "$root"); '
         'if [ "$have" -lt "$3" ]; then echo "no space: the engine root $root has '
         '$((have / 1024)) MiB free, the image needs $(($3 / 1024 + 1)) MiB"; exit 6; fi')

EXTRACT_ROLE = "dev.tfsdeploy.role=extract"
EXTRACT_MODEL = "dev.tfsdeploy.extract"  # label: the model whose version it copies out

# "$1" image reference, "$2" staging directory, "$3" model; the container is created (never
# started) only to copy the files out of the image, and always removed
_EXTRACT = ('rm -rf -- "$2" && mkdir -p -m 0755 -- "$2" || exit 1; '
            f'cid=$(docker create --label {EXTRACT_ROLE} --label "{EXTRACT_MODEL}=$3" '
            '"$1" tfsdeploy-extract) || { rm -rf -- "$2"; exit 1; }; '
            'docker cp "$cid:/version" "$2/"; code=$?; docker rm -f "$cid" >/dev/null; '
            'if [ $code != 0 ] || [ ! -d "$2/version" ]; then rm -rf -- "$2"; '
            'echo "the image holds no /version directory"; exit 1; fi; '
            'chmod -R u=rwX,go=rX -- "$2"')

# "$1" staging directory holding version/ and SHA256SUMS (the source's sums); exit 5 naming
# the first differences (missing, extra or changed files); the staging directory is removed
_VERIFY = ('cd "$1/version" || exit 1; '
           'find . -type f | sed "s|^\\./||" | LC_ALL=C sort > ../found; '
           'cut -c67- ../SHA256SUMS | LC_ALL=C sort > ../wanted; '
           'extra=$(LC_ALL=C comm -13 ../wanted ../found | head -3); '
           'missing=$(LC_ALL=C comm -23 ../wanted ../found | head -3); '
           'bad=$(sha256sum --check ../SHA256SUMS 2>/dev/null | grep -v ": OK$" | head -3); '
           'if [ -n "$extra$missing$bad" ]; then cd /; rm -rf -- "$1"; '
           'echo "the pulled files differ from the manifest:"; '
           '[ -z "$missing" ] || echo "missing: $missing"; '
           '[ -z "$extra" ] || echo "not in the manifest: $extra"; '
           '[ -z "$bad" ] || echo "$bad"; exit 5; fi; rm -f ../found ../wanted')


def free_space(directory: str, *, need_bytes: int, image_bytes: int) -> Argv:
    """Exit 6 with a line saying which filesystem lacks room when ``directory`` cannot hold
    ``need_bytes`` or the engine's root directory the image's ``image_bytes``."""
    return ["sh", "-c", _FREE, "sh", directory, str(-(-need_bytes // 1024)),
            str(-(-image_bytes // 1024))]


def extract(reference: str, staging: str, *, model: str) -> Argv:
    """Copy ``/version`` out of the pulled image into ``staging/version`` (a fresh
    directory); the helper container (labelled with ``model``) is removed whatever happens."""
    return ["sh", "-c", _EXTRACT, "sh", reference, staging, model]


# "$1" the model's versions directory, "$2" the model, "$3" its image repository ("": none):
# prints "file <name>" for each stage's leftover beside the versions (a pull's .pull-<v>, a
# push's .staging-<v>-<release> and its .tar, a reused version's .sums-<v>-<release>: dot
# names, never loaded by TFServing) and "container <id>" for each extract container of the
# model (labelled so, or, made before the label, created from the model's repository)
_LEFTOVERS = ('leftovers() { if cd -- "$1" 2>/dev/null; then '
              'for f in .pull-* .staging-* .sums-*; do '
              '{ [ -e "$f" ] || [ -L "$f" ]; } && printf "file %s\\n" "$f"; done; cd /; fi; '
              f'docker ps -a --filter label={EXTRACT_ROLE} '
              f'--format \'{{{{.ID}}}}|{{{{.Label "{EXTRACT_MODEL}"}}}}|{{{{.Image}}}}\' '
              '2>/dev/null | awk -F"|" -v m="$2" -v p="$3" '
              '\'$2 == m || ($2 == "" && p != "" && index($3, p) == 1) '
              '{ print "container " $1 }\'; }; ')
_REMOVE_LEFTOVERS = (_LEFTOVERS + 'leftovers "$@" | while read -r kind name; do '
                     'case $kind in file) rm -rf -- "$1/$name" || exit 1;; '
                     'container) docker rm -f -- "$name" >/dev/null || exit 1;; esac; '
                     f'echo "$kind $name"; done && {{ [ ! -d "$1" ] || {SYNC} "$1"; }}')


def leftovers(models_dir: str, *, model: str, repository: str) -> Argv:
    """List what killed stages of ``model`` left (one ``file <name>`` or ``container <id>``
    a line; reads only). ``repository``: ``registry/repository@`` of the model's images
    ("" when it pulls none)."""
    return ["sh", "-c", _LEFTOVERS + 'leftovers "$@"', "sh", models_dir, model, repository]


def remove_leftovers(models_dir: str, *, model: str, repository: str) -> Argv:
    """Remove what ``leftovers`` lists (each removed one printed), the directory fsynced."""
    return ["sh", "-c", _REMOVE_LEFTOVERS, "sh", models_dir, model, repository]


def verify_pulled(staging: str) -> Argv:
    """Exit 5, naming what differs, unless ``staging/version`` holds exactly the files of
    ``staging/SHA256SUMS`` with those sums (the staging directory is then removed)."""
    return ["sh", "-c", _VERIFY, "sh", staging]
