"""Runs the project's tests in a guest booted on a distribution's stock kernel (``scripts/guest-test.sh``).

This machine's kernel is not the one users have: the guest boots Debian's own
kernel package under qemu, with the host's root filesystem shared read-only
(plus a tmpfs overlay) so that the project, its venv and BCC are the same
files, runs a chosen set of tests as root and brings back pytest's exit status
and output through a second, writable share. :mod:`guest.kernel` fetches and
unpacks the kernel and builds the initramfs; :mod:`guest.vm` boots and collects.
"""
