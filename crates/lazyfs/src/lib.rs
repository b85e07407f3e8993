//! A FUSE filesystem that forgets what was not fsync'd: test support for durability
//! claims, in the manner of Jepsen's LazyFS.
//!
//! Killing a process (`kill -9`) does not test durability: whatever it wrote sits in the
//! OS page cache, which survives. [`LazyFs`] mounts a passthrough of a backing directory
//! whose writes stay in a page cache *of its own* until the file is fsync'd;
//! [`LazyFs::power_cut`] then drops every unsynced write, as losing power would. A store
//! that acknowledges before fsync loses acknowledged data here, visibly.
//!
//! # What is modelled
//!
//! - **File data and length.** `write`/`pwrite`, `ftruncate` and `fallocate` (mode 0) of
//!   a file are kept in memory ([`page_cache::PageCache`], 4 KiB pages) and read back from
//!   there; they reach the backing file only when the file is `fsync`'d or `fdatasync`'d
//!   (through any handle). `O_SYNC`/`O_DSYNC` writes and `msync(MS_SYNC)` count too: the
//!   kernel turns them into an fsync of the file.
//! - **Power cut.** [`LazyFs::power_cut`] drops every unsynced write and truncation of
//!   every file, all of them: no torn page survives and no subset is kept. That is the
//!   harshest loss a real disk allows for unsynced data (it may keep any subset).
//! - **Failing fsync.** [`LazyFs::set_fsync_fault`] makes `fsync`/`fdatasync` (and a
//!   directory fsync) answer `EIO`, for every file or for paths ending in a suffix (e.g.
//!   `-wal`). A failed fsync moves nothing to the backing file: those writes stay
//!   volatile and the next power cut drops them.
//! - **Shared memory maps.** Files are not opened in `direct_io` mode, so `mmap(MAP_SHARED)`
//!   works; the kernel writes dirty mapped pages back through `write`, and they are
//!   cached like any other write. SQLite's `-shm` index runs on the mount this way, with no
//!   special case; it is never fsync'd (SQLite rebuilds it from the WAL after a crash),
//!   so a power cut empties it.
//!
//! # What is not
//!
//! - **Directory entries are durable at once.** Create, unlink, rename, mkdir, rmdir and
//!   chmod/chown/utimes go straight to the backing directory, as if each were followed by
//!   an fsync of its directory; `fsyncdir` only checks the fault switch. A program that
//!   forgets to fsync a directory after creating a file is therefore *not* caught — but a
//!   new file's *contents* are: a file created and written without an fsync is empty
//!   after a power cut (the "zero-length file" of delayed allocation).
//! - **`sync(2)`, `syncfs(2)` and `sync_file_range(2)`** are not forwarded to FUSE by the
//!   kernel, so they persist nothing here (on a real disk `sync` would). SQLite uses
//!   neither.
//! - Torn or reordered writes, bit rot, `ENOSPC`, failing reads or writes, hard links,
//!   symlinks, special files and extended attributes (the last four answer an error).
//! - The backing file itself is written but not fsync'd at a modelled fsync: the host does
//!   not lose power; the only power cut under test is [`LazyFs::power_cut`].
//! - Locks (`fcntl`, `flock`) are kept by the kernel, as for any FUSE filesystem that does
//!   not implement them: they work between processes of one machine.
//!
//! Call [`LazyFs::power_cut`] when no process has files open on the mount (kill the
//! process under test first): a process still running would see its files change under
//! it, which no real power cut allows.
//!
//! # Mounting
//!
//! Needs `/dev/fuse`. As root, fuser mounts it directly; otherwise it goes through the
//! `fusermount3` binary (Debian package `fuse3`). No libfuse is linked.
//!
//! ```no_run
//! let backing = tempfile::tempdir().unwrap();
//! let mnt = tempfile::tempdir().unwrap();
//! let fs = lazyfs::LazyFs::mount(backing.path(), mnt.path()).unwrap();
//! std::fs::write(mnt.path().join("f"), b"not synced").unwrap();
//! let cut = fs.power_cut();
//! assert_eq!(cut.files, 1);
//! assert_eq!(std::fs::read(mnt.path().join("f")).unwrap(), b"");
//! ```

mod fs;
pub mod page_cache;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// FUSE threads serving the mount. Two, so a long read of one file does not stall the
/// writer's fsync of another; every request takes one lock anyway (see `fs`).
const FUSE_THREADS: usize = 2;

/// When an fsync answers `EIO`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FsyncFault {
    /// Every fsync works (the default).
    #[default]
    Off,
    /// Every fsync and directory fsync fails.
    Every,
    /// The fsync of a path (relative to the mount) ending in this suffix fails, e.g. `-wal`.
    PathSuffix(String),
}

/// Counters since the mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Fsyncs (files and directories) that succeeded.
    pub fsyncs: u64,
    /// Fsyncs answered `EIO` by the fault switch.
    pub failed_fsyncs: u64,
}

/// What a [`LazyFs::power_cut`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerCut {
    /// Files that had unsynced writes, truncations or extensions.
    pub files: usize,
    /// Dirty bytes dropped, counted in whole 4 KiB pages.
    pub bytes: u64,
}

/// A mounted lazy filesystem. Dropping it unmounts (the backing directory keeps what was
/// fsync'd).
#[derive(Debug)]
pub struct LazyFs {
    state: Arc<Mutex<fs::State>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl LazyFs {
    /// Serve `backing` at `mountpoint` (an existing, empty directory) until dropped.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<Self> {
        if !Path::new("/dev/fuse").exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/dev/fuse is absent",
            ));
        }
        let state = Arc::new(Mutex::new(fs::State::new(backing.canonicalize()?)));
        let ops = fs::LazyFsOps {
            state: state.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("lazyfs".into()),
            fuser::MountOption::Subtype("lazyfs".into()),
        ];
        config.n_threads = Some(FUSE_THREADS);
        config.clone_fd = true;
        let session = fuser::spawn_mount(ops, mountpoint, &config)?;
        Ok(Self {
            state,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Lose power: drop every write, truncation and extension not yet fsync'd, in every
    /// file. Kill the processes using the mount first (see the crate doc).
    pub fn power_cut(&self) -> PowerCut {
        let (files, bytes) = self.state().power_cut();
        PowerCut { files, bytes }
    }

    /// Make fsyncs fail (or work again, with [`FsyncFault::Off`]) from now on.
    pub fn set_fsync_fault(&self, fault: FsyncFault) {
        self.state().fault = fault;
    }

    /// Counters since the mount.
    pub fn stats(&self) -> Stats {
        self.state().stats
    }

    /// Unmount and wait for the FUSE threads to end.
    pub fn unmount(mut self) -> io::Result<()> {
        self.session.take().map_or(Ok(()), |s| s.umount_and_join())
    }

    fn state(&self) -> MutexGuard<'_, fs::State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}
