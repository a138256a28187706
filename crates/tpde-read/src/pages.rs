//! Fresh output memory. A buffer just allocated for decoded tensors (calloc's untouched zero
//! pages) takes a page fault on the first write to each page; asking the kernel to back it with
//! writable pages in a few calls (`MADV_POPULATE_WRITE`, Linux 5.14) saves each fault's entry and
//! exit. On this project's 2-core VM, 150 MB of 2.4 MB arrays were allocated and first written
//! in 104 ms, and in 69 ms populated first (`docs/measurements.md`). On memory already backed
//! (an allocator's recycled pages) the call would be pure cost, a page-table walk (12 ms for
//! the same arrays), so a buffer whose last page is already backed is left alone.

use rayon::prelude::*;

/// The share of a buffer one core populates: large enough that a call's cost is nothing beside
/// its page work, small enough that a large tensor spreads over the cores (one call for a whole
/// 47 MB tensor left the other core waiting: 1.05x the time of faulting pages in on two cores).
const PIECE: usize = 2 << 20;

/// Backs the whole pages inside `buf` with writable memory now, a piece per core at a time,
/// leaving its contents as they are. A piece whose last whole page is backed already is left
/// alone (the allocator recycled it: then so is the rest). Where the kernel or platform has no
/// such advice, the pages fault in as written.
pub fn populate(buf: &mut [u8]) {
    let page = page_size();
    // Pieces start on page boundaries, so that no page straddles two of them and goes unbacked;
    // the bytes before the first boundary hold no whole page.
    let at = buf.as_ptr() as usize;
    let Some(rest) = buf.get_mut(at.next_multiple_of(page) - at..) else { return };
    let piece = PIECE.next_multiple_of(page);
    // A buffer of one piece stays on this thread: a trip through the thread pool costs as much
    // as the work.
    if rest.len() <= piece {
        populate_piece(rest, page);
    } else {
        rest.par_chunks_mut(piece).for_each(|p| populate_piece(p, page));
    }
}

fn page_size() -> usize {
    #[cfg(target_os = "linux")]
    {
        static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        // SAFETY: sysconf reads a constant of the system.
        #[allow(unsafe_code)]
        *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096))
    }
    #[cfg(not(target_os = "linux"))]
    4096
}

/// `populate` for a piece that starts on a page boundary.
fn populate_piece(buf: &mut [u8], page: usize) {
    #[cfg(target_os = "linux")]
    {
        let begin = buf.as_mut_ptr() as usize;
        let end = (begin + buf.len()) / page * page;
        if end <= begin {
            return;
        }
        // The last page, not the first: an allocator writes its own header just before the
        // buffer, which may back the first page of fresh memory.
        let mut resident = 0u8;
        // SAFETY: mincore reads the state of one page inside `buf` and writes one byte into
        // `resident`; it neither reads nor writes the page.
        #[allow(unsafe_code)]
        let asked = unsafe { libc::mincore((end - page) as *mut libc::c_void, page, &mut resident) };
        if asked == 0 && resident & 1 == 1 {
            return;
        }
        // SAFETY: [begin, end) lies inside `buf`, which this function borrows mutably, so
        // nothing else touches it meanwhile; MADV_POPULATE_WRITE maps pages and changes no
        // byte. An error (EINVAL from a kernel before 5.14) only leaves the pages unmapped.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_POPULATE_WRITE)
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (buf, page);
}

#[cfg(test)]
mod tests {
    #[test]
    fn populating_keeps_the_bytes() {
        let mut buf: Vec<u8> = (0..3 * 4096 + 77).map(|i| (i * 7 % 251) as u8).collect();
        let before = buf.clone();
        super::populate(&mut buf[5..]);
        assert_eq!(buf, before);
        let mut fresh = vec![0u8; 1 << 22];
        super::populate(&mut fresh);
        assert!(fresh.iter().all(|&b| b == 0));
    }

    /// Fresh memory (a large calloc: pages the process never touched) is backed after
    /// `populate`, every whole page of it, piece boundaries included, where the kernel has the
    /// advice (Linux 5.14 and later).
    #[cfg(target_os = "linux")]
    #[test]
    #[allow(unsafe_code)]
    fn fresh_pages_are_backed() {
        let page = super::page_size();
        let mut fresh = vec![0u8; 64 << 20];
        let begin = (fresh.as_ptr() as usize).next_multiple_of(page);
        let pages = (fresh.as_ptr() as usize + fresh.len() - begin) / page;
        let resident = || {
            let mut r = vec![0u8; pages];
            // SAFETY: whole pages of a live allocation; mincore writes a byte per page into `r`.
            assert_eq!(unsafe { libc::mincore(begin as *mut libc::c_void, pages * page, r.as_mut_ptr()) }, 0);
            r.iter().filter(|&&b| b & 1 == 1).count()
        };
        if resident() > 1 {
            return; // the allocator gave memory already used: nothing to see here
        }
        super::populate(&mut fresh);
        let mut probe = vec![0u8; 1 << 20];
        let probe_page = ((probe.as_ptr() as usize + 8192) & !0xfff) as *mut libc::c_void;
        // SAFETY: one page inside `probe`, which is live and borrowed here.
        let supported = unsafe { libc::madvise(probe_page, 4096, libc::MADV_POPULATE_WRITE) } == 0;
        probe[0] = 1;
        if supported {
            assert_eq!(resident(), pages, "populate left fresh pages unbacked");
        }
    }
}
