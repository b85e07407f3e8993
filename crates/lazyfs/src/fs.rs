//! The FUSE side: a passthrough of the backing directory whose file *data* goes through
//! a [`PageCache`] per file, and whose *metadata* operations go straight to the backing
//! directory.
//!
//! Inodes are numbered here (the root is 1), one per path seen, and follow their file
//! through renames; an unlinked file that is still open lives on as an orphan until its
//! last handle is released. `forget` is ignored: a test mount sees a few dozen paths.
//! Every answer carries a zero TTL, so the kernel asks again for every attribute and name
//! instead of caching a size that a power cut has since changed; and no file is opened
//! with `FOPEN_KEEP_CACHE`, so the kernel drops its own cached pages of a file at every
//! open (after a power cut, the next process to open a file reads what survived).

use crate::page_cache::PageCache;
use crate::FsyncFault;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, FileTimes, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache a name or an attribute: not at all (see the module doc).
const TTL: Duration = Duration::ZERO;

/// `open(2)` flags the kernel passes on in `create` (Linux values).
const O_EXCL: i32 = 0o200;
const O_TRUNC: i32 = 0o1000;

/// File type bits of a mode, and the regular-file type (Linux values; no libc dependency
/// for four numbers).
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;

/// What the mount knows; shared by the FUSE threads and the [`crate::LazyFs`] handle.
#[derive(Debug)]
pub(crate) struct State {
    /// The directory being served.
    root: PathBuf,
    nodes: HashMap<u64, Node>,
    /// Path relative to `root` → inode, for every node that still has a name.
    by_path: HashMap<PathBuf, u64>,
    next_ino: u64,
    pub(crate) fault: FsyncFault,
    pub(crate) stats: crate::Stats,
}

#[derive(Debug)]
struct Node {
    /// Path relative to the root; `None` once unlinked (an orphan kept while open).
    path: Option<PathBuf>,
    /// The backing file, opened read-write on first data access and kept open while the
    /// node lives (so an orphan's data stays reachable).
    file: Option<File>,
    /// Unsynced state; `None` until the first data access.
    cache: Option<PageCache>,
    /// Open handles (`open`/`create` minus `release`).
    open: u32,
}

impl State {
    pub(crate) fn new(root: PathBuf) -> Self {
        let mut s = Self {
            root,
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            next_ino: INodeNo::ROOT.0 + 1,
            fault: FsyncFault::Off,
            stats: crate::Stats::default(),
        };
        s.nodes.insert(INodeNo::ROOT.0, Node::named(PathBuf::new()));
        s.by_path.insert(PathBuf::new(), INodeNo::ROOT.0);
        s
    }

    /// Drop every unsynced write of every file; returns (files that lost data, bytes).
    pub(crate) fn power_cut(&mut self) -> (usize, u64) {
        let mut files = 0;
        let mut bytes = 0;
        for node in self.nodes.values_mut() {
            if let Some(cache) = &mut node.cache {
                if !cache.is_clean() {
                    files += 1;
                }
                bytes += cache.power_cut();
            }
        }
        (files, bytes)
    }

    fn node(&mut self, ino: INodeNo) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)
    }

    fn rel(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.nodes
            .get(&ino.0)
            .and_then(|n| n.path.clone())
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.rel(parent)?.join(name))
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// The inode of `rel`, numbering it if it is new.
    fn ino_of(&mut self, rel: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(rel) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node::named(rel.to_path_buf()));
        self.by_path.insert(rel.to_path_buf(), ino);
        ino
    }

    /// `rel` no longer names its node: orphan it, or drop it if nothing has it open.
    fn unname(&mut self, rel: &Path) {
        if let Some(ino) = self.by_path.remove(rel) {
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = None;
                if node.open == 0 {
                    self.nodes.remove(&ino);
                }
            }
        }
    }

    /// Attributes of `ino`: the backing file's, with the size the cache says.
    fn attr(&mut self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let path = self.nodes.get(&ino.0).and_then(|n| n.path.clone());
        let full = path.map(|p| self.full(&p));
        let node = self.node(ino)?;
        let meta = match (&node.file, full) {
            (Some(f), _) => f.metadata()?,
            (None, Some(full)) => std::fs::symlink_metadata(full)?,
            (None, None) => return Err(Errno::ENOENT),
        };
        let size = node.cache.as_ref().map_or(meta.len(), PageCache::len);
        Ok(to_attr(ino, &meta, size))
    }

    /// Run `f` on the node's cache and backing file (opening / creating them as needed).
    fn with_cache<T>(
        &mut self,
        ino: INodeNo,
        f: impl FnOnce(&mut PageCache, &mut File) -> io::Result<T>,
    ) -> Result<T, Errno> {
        let full = self
            .nodes
            .get(&ino.0)
            .and_then(|n| n.path.clone())
            .map(|p| self.full(&p));
        let node = self.node(ino)?;
        if node.file.is_none() {
            let full = full.ok_or(Errno::ENOENT)?;
            node.file = Some(OpenOptions::new().read(true).write(true).open(full)?);
        }
        let Node { file, cache, .. } = node;
        let file = file.as_mut().ok_or(Errno::EIO)?;
        if cache.is_none() {
            *cache = Some(PageCache::new(file.metadata()?.len()));
        }
        let cache = cache.as_mut().ok_or(Errno::EIO)?;
        Ok(f(cache, file)?)
    }

    /// Whether an fsync of `ino` must fail (and count it).
    fn fsync_fails(&mut self, ino: INodeNo) -> bool {
        let path = self.nodes.get(&ino.0).and_then(|n| n.path.clone());
        let fails = match (&self.fault, path) {
            (FsyncFault::Off, _) => false,
            (FsyncFault::Every, _) => true,
            (FsyncFault::PathSuffix(suffix), Some(p)) => {
                p.to_string_lossy().ends_with(suffix.as_str())
            }
            (FsyncFault::PathSuffix(_), None) => false,
        };
        if fails {
            self.stats.failed_fsyncs += 1;
        }
        fails
    }

    fn entry(&mut self, rel: &Path) -> Result<FileAttr, Errno> {
        let ino = self.ino_of(rel);
        self.attr(INodeNo(ino))
    }
}

impl Node {
    fn named(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            file: None,
            cache: None,
            open: 0,
        }
    }
}

fn to_attr(ino: INodeNo, m: &Metadata, size: u64) -> FileAttr {
    let time = |secs: i64, nanos: i64| {
        UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: FileType::from_std(m.file_type()).unwrap_or(FileType::RegularFile),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: crate::page_cache::PAGE_BYTES as u32,
        flags: 0,
    }
}

fn system_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The [`Filesystem`] served by fuser's threads.
#[derive(Debug)]
pub(crate) struct LazyFsOps {
    pub(crate) state: Arc<Mutex<State>>,
}

impl LazyFsOps {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic in another FUSE thread leaves the maps consistent enough to go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Filesystem for LazyFsOps {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.state();
        let r = s.child(parent, name).and_then(|rel| {
            std::fs::symlink_metadata(s.full(&rel))?;
            s.entry(&rel)
        });
        answer_entry(r, reply)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = self.state();
        let r = (|| {
            if let Some(size) = size {
                // Data: a truncation is unsynced state like a write.
                s.with_cache(ino, |c, _| {
                    c.set_len(size);
                    Ok(())
                })?;
            }
            // Metadata: straight to the backing directory.
            let full = s.rel(ino).map(|r| s.full(&r));
            if let Some(mode) = mode {
                std::fs::set_permissions(full.clone()?, std::fs::Permissions::from_mode(mode))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(full.clone()?, uid, gid)?;
            }
            if atime.is_some() || mtime.is_some() {
                let mut times = FileTimes::new();
                if let Some(t) = atime {
                    times = times.set_accessed(system_time(t));
                }
                if let Some(t) = mtime {
                    times = times.set_modified(system_time(t));
                }
                File::open(full?)?.set_times(times)?;
            }
            s.attr(ino)
        })();
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & S_IFMT != S_IFREG {
            reply.error(Errno::EPERM); // only regular files are modelled
            return;
        }
        let mut s = self.state();
        let r = s.child(parent, name).and_then(|rel| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode & !umask & 0o7777)
                .open(s.full(&rel))?;
            s.entry(&rel)
        });
        answer_entry(r, reply)
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = self.state();
        let r = s.child(parent, name).and_then(|rel| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(s.full(&rel))?;
            s.entry(&rel)
        });
        answer_entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        let r = s.child(parent, name).and_then(|rel| {
            std::fs::remove_file(s.full(&rel))?;
            s.unname(&rel);
            Ok(())
        });
        answer_empty(r, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = self.state();
        let r = s.child(parent, name).and_then(|rel| {
            std::fs::remove_dir(s.full(&rel))?;
            s.unname(&rel);
            Ok(())
        });
        answer_empty(r, reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            reply.error(Errno::EINVAL); // RENAME_NOREPLACE / EXCHANGE are not modelled
            return;
        }
        let mut s = self.state();
        let r = (|| {
            let from = s.child(parent, name)?;
            let to = s.child(newparent, newname)?;
            std::fs::rename(s.full(&from), s.full(&to))?;
            if s.by_path.get(&to) != s.by_path.get(&from) {
                s.unname(&to);
            }
            // The renamed node and everything under it (a directory) follow the new name.
            let moved: Vec<(PathBuf, u64)> = s
                .by_path
                .iter()
                .filter(|(p, _)| p.starts_with(&from))
                .map(|(p, &ino)| (p.clone(), ino))
                .collect();
            for (old, ino) in moved {
                let Ok(rest) = old.strip_prefix(&from) else {
                    continue;
                };
                let new = if rest.as_os_str().is_empty() {
                    to.clone()
                } else {
                    to.join(rest)
                };
                s.by_path.remove(&old);
                s.by_path.insert(new.clone(), ino);
                if let Some(node) = s.nodes.get_mut(&ino) {
                    node.path = Some(new);
                }
            }
            Ok::<(), Errno>(())
        })();
        answer_empty(r, reply)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.state();
        let r = s.with_cache(ino, |_, _| Ok(()));
        match r.and_then(|()| s.node(ino)) {
            Ok(node) => {
                node.open += 1;
                reply.opened(FileHandle(0), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = self.state();
        let r = (|| {
            let rel = s.child(parent, name)?;
            let mut opts = OpenOptions::new();
            opts.read(true).write(true).mode(mode & !umask & 0o7777);
            if flags & O_EXCL != 0 {
                opts.create_new(true);
            } else {
                opts.create(true);
            }
            let file = opts.open(s.full(&rel))?;
            let ino = INodeNo(s.ino_of(&rel));
            let node = s.node(ino)?;
            if node.file.is_none() {
                node.file = Some(file);
            }
            node.open += 1;
            if flags & O_TRUNC != 0 {
                s.with_cache(ino, |c, _| {
                    c.set_len(0);
                    Ok(())
                })?;
            }
            s.attr(ino)
        })();
        match r {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .state()
            .with_cache(ino, |c, f| c.read(f, offset, size as usize))
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self
            .state()
            .with_cache(ino, |c, f| c.write(f, offset, data))
        {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) is no durability point.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        if let Ok(node) = s.node(ino) {
            node.open = node.open.saturating_sub(1);
            if node.open == 0 && node.path.is_none() {
                s.nodes.remove(&ino.0);
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        if s.fsync_fails(ino) {
            // Nothing reaches the backing file: the unsynced writes stay volatile.
            reply.error(Errno::EIO);
            return;
        }
        match s.with_cache(ino, |c, f| c.sync(f)) {
            Ok(()) => {
                s.stats.fsyncs += 1;
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = self.state();
        let r = (|| {
            let rel = s.rel(ino)?;
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(s.full(&rel))? {
                let e = e?;
                let kind = FileType::from_std(e.file_type()?).unwrap_or(FileType::RegularFile);
                let child = s.ino_of(&rel.join(e.file_name()));
                entries.push((child, kind, e.file_name()));
            }
            Ok::<_, Errno>(entries)
        })();
        match r {
            Ok(entries) => {
                for (i, (child, kind, name)) in
                    entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory entries are already durable (see the crate doc); only the fault applies.
        let mut s = self.state();
        if s.fsync_fails(ino) {
            reply.error(Errno::EIO);
        } else {
            s.stats.fsyncs += 1;
            reply.ok();
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            reply.error(Errno::EOPNOTSUPP); // punch hole, keep size, …: not modelled
            return;
        }
        let r = self.state().with_cache(ino, |c, _| {
            let end = offset.saturating_add(length);
            if end > c.len() {
                c.set_len(end);
            }
            Ok(())
        });
        answer_empty(r, reply)
    }
}

/// Answer an operation that returns nothing.
fn answer_empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Answer an operation that returns a directory entry.
fn answer_entry(r: Result<FileAttr, Errno>, reply: ReplyEntry) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}
