//! Polling a catalog file for changes without parsing it while it is unchanged. A poll that finds
//! the file's metadata as it was (and settled, see [`SETTLED`]) reads only the small files the
//! catalog references; one that finds new metadata reads the text and compares its SHA-256 with
//! the last; only a new text is parsed, to learn which files it references. Either way the
//! fingerprint is [`super::Loaded::of`]'s for the same text and files, so a poll and a load agree.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use sha2::Digest;

use super::{file_digests, fingerprint, referenced_files, yaml_bounds};

/// What a poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    /// The catalog's fingerprint: its text and the content of the files it references.
    pub fingerprint: [u8; 32],
    /// Whether the text was parsed, because it was new or had changed.
    pub parsed: bool,
}

/// Remembers what the last poll of a file saw.
#[derive(Debug, Default)]
pub struct CatalogWatch {
    last: Option<Seen>,
    /// Times the text was read (for tests: a settled, unchanged file is not read at all).
    texts_read: u64,
}

#[derive(Debug)]
struct Seen {
    path: PathBuf,
    /// The file's metadata as it was read, when settled enough to show any later write.
    stamp: Option<Stamp>,
    text_sha: [u8; 32],
    referenced: Vec<PathBuf>,
    digests: Vec<[u8; 32]>,
    fingerprint: [u8; 32],
}

/// What a write to the file (or a symlink swap to another file) changes: its identity, length and
/// times. `ctime` cannot be set by anyone, so even a write that restores `mtime` changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// A stamp whose newest time is less than this before the read is not trusted: a write within
/// the file system's timestamp granularity (up to 2 s on some) could leave it as it was.
const SETTLED: Duration = Duration::from_secs(2);

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }

    /// Whether the file had been left alone for [`SETTLED`] at `now`.
    fn settled(&self, now: SystemTime) -> bool {
        let (secs, nanos) = self.mtime.max(self.ctime);
        let (Ok(secs), Ok(nanos)) = (u64::try_from(secs), u32::try_from(nanos)) else {
            return false;
        };
        let newest = UNIX_EPOCH + Duration::new(secs, nanos);
        now.duration_since(newest).is_ok_and(|age| age >= SETTLED)
    }
}

impl CatalogWatch {
    /// Looks at the catalog at `path` (in `base_dir`); `None` when it cannot be read or is over
    /// the size bound.
    pub fn poll(&mut self, path: &Path, base_dir: &Path) -> Option<Polled> {
        self.poll_at(path, base_dir, SystemTime::now())
    }

    fn poll_at(&mut self, path: &Path, base_dir: &Path, now: SystemTime) -> Option<Polled> {
        let stamp = Stamp::of(path);
        let last = self.last.take().filter(|seen| seen.path == path);
        if let Some(seen) = &last
            && stamp.is_some()
            && seen.stamp == stamp
        {
            let digests = file_digests(&seen.referenced);
            if digests == seen.digests {
                let fingerprint = seen.fingerprint;
                self.last = last;
                return Some(Polled {
                    fingerprint,
                    parsed: false,
                });
            }
        }
        self.texts_read += 1;
        let text = yaml_bounds::read_bounded(path).ok()?;
        let text_sha: [u8; 32] = sha2::Sha256::digest(text.as_bytes()).into();
        let (referenced, parsed) = match last {
            Some(seen) if seen.text_sha == text_sha => (seen.referenced, false),
            _ => (referenced_files(&text, base_dir), true),
        };
        let digests = file_digests(&referenced);
        let fingerprint = fingerprint(text.as_bytes(), &referenced, &digests);
        self.last = Some(Seen {
            path: path.to_path_buf(),
            // Taken before the read: a write between the two changes it for the next poll.
            stamp: stamp.filter(|s| s.settled(now)),
            text_sha,
            referenced,
            digests,
            fingerprint,
        });
        Some(Polled {
            fingerprint,
            parsed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Loaded;

    #[test]
    fn a_poll_agrees_with_a_load_and_parses_only_new_text() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "one").unwrap();
        let catalog = dir.path().join("catalog.yaml");
        let text = "version: 1\nidentity:\n  jwt: { hs256_secret_file: secret }\ntenants: { acme: {} }\ntools: []\n";
        std::fs::write(&catalog, text).unwrap();
        let mut watch = CatalogWatch::default();
        let first = watch.poll(&catalog, dir.path()).unwrap();
        assert!(first.parsed);
        assert_eq!(first.fingerprint, Loaded::of(text, dir.path()).fingerprint);
        // Unchanged, and rewritten with the same bytes: not parsed.
        assert!(!watch.poll(&catalog, dir.path()).unwrap().parsed);
        std::fs::write(&catalog, text).unwrap();
        let same = watch.poll(&catalog, dir.path()).unwrap();
        assert_eq!(same, first.clone_unparsed());
        // A referenced file changed: a new fingerprint, still without parsing the catalog.
        std::fs::write(&secret, "two").unwrap();
        let rotated = watch.poll(&catalog, dir.path()).unwrap();
        assert!(!rotated.parsed);
        assert_ne!(rotated.fingerprint, first.fingerprint);
        assert_eq!(
            rotated.fingerprint,
            Loaded::of(text, dir.path()).fingerprint
        );
        // New text is parsed.
        let edited = text.replace("acme", "globex");
        std::fs::write(&catalog, &edited).unwrap();
        let changed = watch.poll(&catalog, dir.path()).unwrap();
        assert!(changed.parsed);
        assert_eq!(
            changed.fingerprint,
            Loaded::of(&edited, dir.path()).fingerprint
        );
    }

    #[test]
    fn a_settled_unchanged_file_is_not_even_read_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = dir.path().join("catalog.yaml");
        let text = "version: 1\ntenants: { acme: {} }\ntools: []\n";
        std::fs::write(&catalog, text).unwrap();
        let mut watch = CatalogWatch::default();
        // Polled as if 10 s had passed since the write: its stamp is settled.
        let later = SystemTime::now() + Duration::from_secs(10);
        let first = watch.poll_at(&catalog, dir.path(), later).unwrap();
        for _ in 0..3 {
            assert_eq!(
                watch.poll_at(&catalog, dir.path(), later).unwrap(),
                first.clone_unparsed()
            );
        }
        assert_eq!(watch.texts_read, 1);
        // Any write changes the stamp (ctime at least), so the text is read again.
        std::fs::write(&catalog, text.replace("acme", "globex")).unwrap();
        assert!(watch.poll_at(&catalog, dir.path(), later).unwrap().parsed);
        assert_eq!(watch.texts_read, 2);
    }

    #[test]
    fn a_settled_stamp_skips_the_read_and_a_fresh_one_does_not() {
        let now = SystemTime::now();
        let secs =
            |t: SystemTime| i64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap();
        let stamp = |at: SystemTime| Stamp {
            dev: 1,
            ino: 1,
            len: 1,
            mtime: (secs(at), 0),
            ctime: (secs(at), 0),
        };
        assert!(stamp(now - Duration::from_secs(10)).settled(now));
        assert!(!stamp(now).settled(now));
        assert!(!stamp(now + Duration::from_secs(10)).settled(now));
    }

    impl Polled {
        fn clone_unparsed(self) -> Polled {
            Polled {
                parsed: false,
                ..self
            }
        }
    }
}
