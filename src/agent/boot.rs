//! Which boot this is: the wall-clock start of this userspace, from the kernel's clocks and
//! systemd's start, so a cordon from before a (soft) reboot is known for one.

use super::*;

/// This boot's start on the wall clock: now minus the time since this userspace started, which
/// is the kernel's boot (`CLOCK_BOOTTIME`, which counts suspended time too) moved on by
/// `userspace_since_boot`. A `systemctl soft-reboot` keeps the kernel and its clocks but starts
/// userspace, and this agent, anew: a shutdown cordon made before it is from before this boot.
/// A syscall rather than /proc/stat, which the hardened unit hides (`ProcSubset=pid`).
pub(super) fn boot_time(userspace_since_boot: Duration) -> Option<jiff::Timestamp> {
    use nix::time::ClockId;
    this_boot(
        jiff::Timestamp::now(),
        clock(ClockId::CLOCK_BOOTTIME)?,
        userspace_since_boot,
    )
}

/// [`boot_time`]'s arithmetic: `now` less the time since userspace started.
pub(super) fn this_boot(
    now: jiff::Timestamp,
    since_kernel_boot: Duration,
    userspace_since_boot: Duration,
) -> Option<jiff::Timestamp> {
    let up = since_kernel_boot.saturating_sub(userspace_since_boot);
    now.checked_sub(jiff::SignedDuration::try_from(up).ok()?)
        .ok()
}

/// Where on `CLOCK_BOOTTIME` userspace started, from systemd's start on `CLOCK_MONOTONIC`
/// ([`crate::systemd::Systemd::userspace_start_monotonic`]): the two clocks differ by the
/// time spent suspended, all of it counted as before the start (at worst the boot reads a
/// little later than it was).
pub(super) fn userspace_since_boot(monotonic_start: Duration) -> Option<Duration> {
    use nix::time::ClockId;
    let suspended =
        clock(ClockId::CLOCK_BOOTTIME)?.saturating_sub(clock(ClockId::CLOCK_MONOTONIC)?);
    monotonic_start.checked_add(suspended)
}

pub(super) fn clock(id: nix::time::ClockId) -> Option<Duration> {
    let t = nix::time::clock_gettime(id).ok()?;
    Some(Duration::new(
        u64::try_from(t.tv_sec()).ok()?,
        u32::try_from(t.tv_nsec()).ok()?,
    ))
}
