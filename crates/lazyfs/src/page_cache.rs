//! The page cache of one file: what a process wrote but has not yet fsync'd.
//!
//! This is the whole durability model of the crate, kept free of FUSE so it can be
//! unit-tested on a `Vec<u8>`. A file is two layers:
//!
//! - the **backing** file (on the real disk under the backing directory), which holds
//!   exactly what the last successful `fsync` made durable;
//! - the **cache**: dirty pages and a logical length, which every read and write of the
//!   mounted file sees, and which reach the backing file only on [`PageCache::sync`].
//!
//! [`PageCache::power_cut`] throws the cache away: the file is again what the backing file
//! holds. Writes are all-or-nothing per `fsync` (no torn pages, no partial loss, no
//! reordering of unsynced writes): a power cut loses *every* unsynced write, the harshest
//! outcome a real disk allows for data that was never synced.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::io;

/// Granularity of the cache. 4 KiB is the Linux page size, so a page here is what the
/// kernel's own page cache would hold dirty; writes smaller than a page read the rest of
/// it from the backing file first (read-modify-write), as a kernel does.
pub const PAGE_BYTES: u64 = 4096;

/// Where a cache's durable bytes live. Implemented for [`std::fs::File`] and, for tests,
/// for `Vec<u8>`.
pub trait Backing {
    /// Fill `buf` from `offset`; return how many bytes were read (short at end of file).
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Write all of `buf` at `offset`, extending the file if needed.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncate or extend (with zeros) to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl Backing for std::fs::File {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match std::os::unix::fs::FileExt::read_at(self, &mut buf[done..], offset + done as u64)
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }
}

impl Backing for Vec<u8> {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = (offset as usize).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset as usize + buf.len();
        if self.len() < end {
            self.resize(end, 0);
        }
        self[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.resize(len as usize, 0);
        Ok(())
    }
}

/// Unsynced state of one file. Invariant: `floor <= len` and `floor <= durable_len`;
/// backing bytes below `floor` are current unless a dirty page overrides them, and every
/// byte in `floor..len` that no dirty page covers reads as zero (it was truncated away
/// or never written since the last sync).
#[derive(Debug, Clone)]
pub struct PageCache {
    /// Length of the backing file, as left by the last sync.
    durable_len: u64,
    /// Length the mounted file has now.
    len: u64,
    /// Lowest length the file was truncated to since the last sync.
    floor: u64,
    /// Page index → the page's current bytes (always [`PAGE_BYTES`] long; bytes at or
    /// past `len` are zero).
    dirty: BTreeMap<u64, Box<[u8]>>,
}

impl PageCache {
    /// A clean cache over a backing file of `durable_len` bytes.
    pub fn new(durable_len: u64) -> Self {
        Self {
            durable_len,
            len: durable_len,
            floor: durable_len,
            dirty: BTreeMap::new(),
        }
    }

    /// Length of the file as processes see it.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether everything is synced (nothing a power cut would lose).
    pub fn is_clean(&self) -> bool {
        self.dirty.is_empty() && self.len == self.durable_len && self.floor == self.durable_len
    }

    /// Bytes held in dirty pages (what a power cut would drop, page-rounded).
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty.len() as u64 * PAGE_BYTES
    }

    /// Read up to `size` bytes at `offset` (short at end of file).
    pub fn read(
        &self,
        backing: &mut impl Backing,
        offset: u64,
        size: usize,
    ) -> io::Result<Vec<u8>> {
        let end = offset.saturating_add(size as u64).min(self.len);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let page = pos / PAGE_BYTES;
            let in_page = (pos % PAGE_BYTES) as usize;
            let n = ((PAGE_BYTES - in_page as u64).min(end - pos)) as usize;
            let dst = &mut out[(pos - offset) as usize..(pos - offset) as usize + n];
            match self.dirty.get(&page) {
                Some(bytes) => dst.copy_from_slice(&bytes[in_page..in_page + n]),
                None => read_durable(self.floor, backing, pos, dst)?,
            }
            pos += n as u64;
        }
        Ok(out)
    }

    /// Write `data` at `offset` into the cache (never to the backing file).
    pub fn write(
        &mut self,
        backing: &mut impl Backing,
        offset: u64,
        data: &[u8],
    ) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let page = pos / PAGE_BYTES;
            let in_page = (pos % PAGE_BYTES) as usize;
            let n = ((PAGE_BYTES - in_page as u64).min(end - pos)) as usize;
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + n];
            self.page_mut(backing, page)?[in_page..in_page + n].copy_from_slice(src);
            pos += n as u64;
        }
        self.len = self.len.max(end);
        Ok(())
    }

    /// Truncate or extend (with zeros) to `len`, in the cache only.
    pub fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(PAGE_BYTES);
            self.dirty.split_off(&first_gone);
            let in_page = (len % PAGE_BYTES) as usize;
            if in_page != 0 {
                if let Some(bytes) = self.dirty.get_mut(&(len / PAGE_BYTES)) {
                    bytes[in_page..].fill(0);
                }
            }
            self.floor = self.floor.min(len);
        }
        self.len = len;
    }

    /// Make the cache durable: apply truncations, write dirty pages and the length to the
    /// backing file. On error the cache keeps everything (the backing file may hold part
    /// of it, as a real disk may after a failed write-back).
    ///
    /// The backing file itself is not fsync'd: the host does not lose power, and the only
    /// power cut under test is [`PageCache::power_cut`].
    pub fn sync(&mut self, backing: &mut impl Backing) -> io::Result<()> {
        if self.floor < self.durable_len {
            backing.set_len(self.floor)?;
        }
        for (&page, bytes) in &self.dirty {
            let start = page * PAGE_BYTES;
            if start >= self.len {
                break;
            }
            let n = (PAGE_BYTES.min(self.len - start)) as usize;
            backing.write_at(&bytes[..n], start)?;
        }
        backing.set_len(self.len)?;
        self.dirty.clear();
        self.durable_len = self.len;
        self.floor = self.len;
        Ok(())
    }

    /// Lose every unsynced write and truncation; return the dirty bytes dropped.
    pub fn power_cut(&mut self) -> u64 {
        let dropped = self.dirty_bytes();
        *self = Self::new(self.durable_len);
        dropped
    }

    /// The dirty page `page`, created from the durable bytes if it is not dirty yet.
    fn page_mut(&mut self, backing: &mut impl Backing, page: u64) -> io::Result<&mut [u8]> {
        let (len, floor) = (self.len, self.floor);
        match self.dirty.entry(page) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let mut bytes = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
                let start = page * PAGE_BYTES;
                if start < len {
                    let n = ((len - start).min(PAGE_BYTES)) as usize;
                    read_durable(floor, backing, start, &mut bytes[..n])?;
                }
                Ok(e.insert(bytes))
            }
        }
    }
}

/// Bytes of the file at `pos..` that no dirty page covers: the backing file's below
/// `floor`, zeros from `floor` on.
fn read_durable(
    floor: u64,
    backing: &mut impl Backing,
    pos: u64,
    dst: &mut [u8],
) -> io::Result<()> {
    dst.fill(0);
    if pos < floor {
        let n = ((floor - pos) as usize).min(dst.len());
        backing.read_at(&mut dst[..n], pos)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache over a backing "file" holding `bytes`.
    fn over(bytes: &[u8]) -> (PageCache, Vec<u8>) {
        (PageCache::new(bytes.len() as u64), bytes.to_vec())
    }

    fn read_all(cache: &PageCache, backing: &mut Vec<u8>) -> Vec<u8> {
        cache.read(backing, 0, usize::MAX / 2).unwrap()
    }

    #[test]
    fn write_is_read_back_but_does_not_reach_the_backing_file() {
        let (mut c, mut b) = over(b"hello world");
        c.write(&mut b, 6, b"there, friend").unwrap();
        assert_eq!(read_all(&c, &mut b), b"hello there, friend");
        assert_eq!(c.len(), 19);
        assert_eq!(b, b"hello world", "backing changed before fsync");
        assert!(!c.is_clean());
    }

    #[test]
    fn fsync_persists_writes_and_length() {
        let (mut c, mut b) = over(b"hello world");
        c.write(&mut b, 6, b"there, friend").unwrap();
        c.sync(&mut b).unwrap();
        assert_eq!(b, b"hello there, friend");
        assert!(c.is_clean());
        assert_eq!(c.power_cut(), 0);
        assert_eq!(read_all(&c, &mut b), b"hello there, friend");
    }

    #[test]
    fn power_cut_drops_unsynced_writes_and_keeps_synced_ones() {
        let (mut c, mut b) = over(b"");
        c.write(&mut b, 0, b"synced").unwrap();
        c.sync(&mut b).unwrap();
        c.write(&mut b, 6, b" and lost").unwrap();
        c.write(&mut b, 0, b"S").unwrap();
        assert_eq!(read_all(&c, &mut b), b"Synced and lost");
        assert_eq!(c.power_cut(), PAGE_BYTES);
        assert_eq!(read_all(&c, &mut b), b"synced");
        assert_eq!(c.len(), 6);
        assert!(c.is_clean());
    }

    #[test]
    fn power_cut_undoes_an_unsynced_truncation() {
        let (mut c, mut b) = over(b"0123456789");
        c.set_len(3);
        assert_eq!(read_all(&c, &mut b), b"012");
        c.power_cut();
        assert_eq!(read_all(&c, &mut b), b"0123456789");
    }

    #[test]
    fn truncate_then_extend_reads_zeros_not_stale_backing_bytes() {
        let (mut c, mut b) = over(b"0123456789");
        c.set_len(3);
        c.set_len(6);
        assert_eq!(read_all(&c, &mut b), b"012\0\0\0");
        c.write(&mut b, 8, b"x").unwrap();
        assert_eq!(read_all(&c, &mut b), b"012\0\0\0\0\0x");
        c.sync(&mut b).unwrap();
        assert_eq!(b, b"012\0\0\0\0\0x");
    }

    #[test]
    fn truncating_inside_a_dirty_page_zeroes_its_tail() {
        let (mut c, mut b) = over(b"");
        c.write(&mut b, 0, b"abcdef").unwrap();
        c.set_len(2);
        c.set_len(6);
        assert_eq!(read_all(&c, &mut b), b"ab\0\0\0\0");
    }

    #[test]
    fn writes_across_pages_and_holes_read_back_exactly() {
        let (mut c, mut b) = over(&[7u8; 5000]);
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        c.write(&mut b, 3000, &data).unwrap();
        c.write(&mut b, 20_000, b"end").unwrap();
        let all = read_all(&c, &mut b);
        assert_eq!(all.len(), 20_003);
        assert_eq!(&all[..3000], &[7u8; 3000][..]);
        assert_eq!(&all[3000..12_000], &data[..]);
        assert!(all[12_000..20_000].iter().all(|&x| x == 0));
        assert_eq!(&all[20_000..], b"end");
        // A read at an offset inside a page, spanning dirty and clean pages.
        assert_eq!(c.read(&mut b, 2998, 4).unwrap(), [7, 7, 0, 1]);
        c.sync(&mut b).unwrap();
        assert_eq!(b, all);
    }

    #[test]
    fn failed_sync_keeps_the_cache() {
        /// A backing file whose writes fail (as a disk returning EIO).
        struct Broken;
        impl Backing for Broken {
            fn read_at(&mut self, _: &mut [u8], _: u64) -> io::Result<usize> {
                Ok(0)
            }
            fn write_at(&mut self, _: &[u8], _: u64) -> io::Result<()> {
                Err(io::Error::from_raw_os_error(5))
            }
            fn set_len(&mut self, _: u64) -> io::Result<()> {
                Ok(())
            }
        }
        let mut c = PageCache::new(0);
        c.write(&mut Broken, 0, b"data").unwrap();
        assert!(c.sync(&mut Broken).is_err());
        assert_eq!(c.read(&mut Broken, 0, 10).unwrap(), b"data");
        assert!(!c.is_clean());
    }

    #[test]
    fn reads_past_the_end_are_short_or_empty() {
        let (c, mut b) = over(b"abc");
        assert_eq!(c.read(&mut b, 1, 10).unwrap(), b"bc");
        assert!(c.read(&mut b, 3, 10).unwrap().is_empty());
        assert!(c.read(&mut b, 100, 10).unwrap().is_empty());
    }
}
