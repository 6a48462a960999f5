#!/bin/sh
# Run on the debootstrapped root (argument: its directory) before it becomes the base image.
set -eu
root=$1
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
       "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/*
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' ! -name locale.alias -exec rm -rf {} +
# containers get these from Docker; never bake the build machine's into the image
: > "$root"/etc/hostname
rm -f "$root"/etc/resolv.conf
printf 'tfsdeploy testbed base (Debian bookworm minbase)\n' > "$root"/etc/tfsdeploy-base
