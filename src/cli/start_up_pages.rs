//! Once the sidecar serves (and the tasks start-up spawned have taken their first steps), the
//! pages of its executable that only start-up read are let go.
//!
//! Start-up runs code from nearly every part of the binary once — the config parser, the
//! schema compiler, the TLS and HTTP clients' construction, the exporter — and the kernel maps
//! up to 16 pages around each page a fault touches, so ~70 % of the code stayed resident in an
//! idle sidecar although a call runs a small part of it (docs/performance.md, "What each
//! optimisation that stays buys"). `MADV_DONTNEED` on a mapping of the executable that holds
//! only the file's own pages (never written: the code and the read-only data) takes those pages
//! out of this process's resident set; whatever runs afterwards faults its pages back in from
//! the page cache, once, as it would after the kernel reclaimed them. Nothing is lost: a mapping with a
//! page of its own (written, e.g. relocated data made read-only) is left alone.

use std::{ops::Range, path::Path};

/// Lets go of the executable's clean pages; best effort (a sidecar serves the same without it).
pub(super) fn release() {
    let released = std::fs::read_link("/proc/self/exe").and_then(|exe| {
        let smaps = std::fs::read_to_string("/proc/self/smaps")?;
        Ok(clean_mappings_of(&smaps, &exe)
            .into_iter()
            .map(|mapping| (advise_dont_need(&mapping.range), mapping.resident_kib))
            .fold((0, 0), |(ok, kib), (done, resident)| match done {
                Ok(()) => (ok + 1, kib + resident),
                Err(_) => (ok, kib),
            }))
    });
    match released {
        Ok((mappings, kib)) => {
            tracing::debug!(mappings, kib, "start-up pages of the executable released");
        }
        Err(err) => tracing::debug!(error = %err, "start-up pages not released"),
    }
}

/// A mapping of the executable whose resident pages are all the file's.
#[derive(Debug, PartialEq, Eq)]
struct CleanMapping {
    range: Range<usize>,
    resident_kib: u64,
}

/// The mappings of `exe` in `smaps` (`/proc/self/smaps`) that are not writable and hold no
/// anonymous page: dropping their pages loses nothing, the file has them.
fn clean_mappings_of(smaps: &str, exe: &Path) -> Vec<CleanMapping> {
    let exe = exe.as_os_str().to_string_lossy();
    let mut found = Vec::new();
    // The mapping being read: its range and resident size, while it is a candidate.
    let mut current: Option<(Range<usize>, Option<u64>, bool)> = None;
    let mut finish = |current: &mut Option<(Range<usize>, Option<u64>, bool)>| {
        if let Some((range, Some(resident_kib), true)) = current.take() {
            found.push(CleanMapping {
                range,
                resident_kib,
            });
        }
    };
    for line in smaps.lines() {
        if let Some((range, perms, path)) = mapping_header(line) {
            finish(&mut current);
            let read_only = perms.starts_with('r') && perms.as_bytes().get(1) == Some(&b'-');
            if read_only && path == exe {
                current = Some((range, None, false));
            }
            continue;
        }
        let Some((_, resident, clean)) = current.as_mut() else {
            continue;
        };
        let mut field = line.split_whitespace();
        match (
            field.next(),
            field.next().and_then(|v| v.parse::<u64>().ok()),
        ) {
            (Some("Rss:"), Some(kib)) => *resident = Some(kib),
            (Some("Anonymous:"), Some(kib)) => *clean = kib == 0,
            _ => {}
        }
    }
    finish(&mut current);
    found
}

/// `start-end perms offset dev inode [path]`: the range, the permissions and the path.
fn mapping_header(line: &str) -> Option<(Range<usize>, &str, &str)> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let range = usize::from_str_radix(start, 16).ok()?..usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    (perms.len() == 4).then_some((range, perms, path))
}

#[expect(
    unsafe_code,
    reason = "madvise(2) has no safe wrapper; the range is a whole mapping of our own"
)]
fn advise_dont_need(range: &Range<usize>) -> std::io::Result<()> {
    // SAFETY: the range is one whole mapping of this process's executable, read from
    // /proc/self/smaps: not writable and holding no anonymous page, so every page it holds is
    // the file's. MADV_DONTNEED on such a private file mapping only unmaps pages; a later access
    // faults the same bytes back in from the file. No Rust object lives in it.
    let done = unsafe {
        libc::madvise(
            range.start as *mut libc::c_void,
            range.end - range.start,
            libc::MADV_DONTNEED,
        )
    };
    match done {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0200000 r--p 00000000 fd:01 42                         /usr/bin/toolgate
Size:               2048 kB
Rss:                1024 kB
Anonymous:             0 kB
VmFlags: rd mr mw me
55d0a0200000-55d0a1200000 r-xp 00200000 fd:01 42                         /usr/bin/toolgate
Size:              16384 kB
Rss:               12000 kB
Anonymous:             0 kB
55d0a1200000-55d0a1300000 r--p 01200000 fd:01 42                         /usr/bin/toolgate
Size:               1024 kB
Rss:                 200 kB
Anonymous:           200 kB
55d0a1300000-55d0a1310000 rw-p 01300000 fd:01 42                         /usr/bin/toolgate
Size:                 64 kB
Rss:                  64 kB
Anonymous:            64 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 7                          /usr/lib/libc.so.6
Size:               1024 kB
Rss:                 900 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0 
Size:               1024 kB
Rss:                 100 kB
Anonymous:           100 kB
7f0000400000-7f0000500000 r--p 00000000 fd:01 43                         /usr/bin/toolgate (deleted)
Size:               1024 kB
Rss:                 100 kB
Anonymous:             0 kB
";

    #[test]
    fn only_the_executables_read_only_mappings_without_a_page_of_their_own_are_released() {
        let found = clean_mappings_of(SMAPS, Path::new("/usr/bin/toolgate"));
        assert_eq!(
            found,
            vec![
                CleanMapping {
                    range: 0x55d0a0000000..0x55d0a0200000,
                    resident_kib: 1024
                },
                CleanMapping {
                    range: 0x55d0a0200000..0x55d0a1200000,
                    resident_kib: 12000
                },
            ],
            "not the relocated read-only data (anonymous pages), the writable data, a library or another file"
        );
    }

    #[test]
    fn a_mapping_whose_anonymous_count_is_missing_is_kept() {
        let smaps = "00400000-00500000 r-xp 00000000 fd:01 42 /bin/t\nRss: 8 kB\n";
        assert_eq!(clean_mappings_of(smaps, Path::new("/bin/t")), vec![]);
    }

    #[test]
    fn this_test_binarys_own_smaps_parse_and_name_its_code() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let found = clean_mappings_of(&smaps, &exe);
        assert!(!found.is_empty(), "no clean mapping of {exe:?} found");
        let code = smaps
            .lines()
            .filter_map(mapping_header)
            .find(|(_, perms, path)| *perms == "r-xp" && Path::new(path) == exe)
            .map(|(range, _, _)| range)
            .unwrap();
        assert!(found.iter().any(|m| m.range == code), "{found:?}");
    }
}
