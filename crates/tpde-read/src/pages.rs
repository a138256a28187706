//! Fresh output memory. A buffer just allocated for decoded tensors (calloc's untouched zero
//! pages) takes a page fault on the first write to each page; asking the kernel to back it with
//! writable pages in a few calls (`MADV_POPULATE_WRITE`, Linux 5.14) saves each fault's entry and
//! exit. On this project's 2-core VM, 150 MB of 2.4 MB arrays were allocated and first written
//! in 104 ms, and in 69 ms populated first (`docs/measurements.md`). On memory already backed
//! (an allocator's recycled pages) the call would be pure cost, a page-table walk (12 ms for
//! the same arrays), so a buffer whose last page is already backed is left alone. Buffers of
//! 4 MiB and more are asked for huge pages first: where the system gives them only to those who
//! ask (transparent huge pages `madvise`, as on this VM), fresh-process reads of whole fp32
//! keyframes through `Reader::read_tensor` took 0.75-0.81x the time.

use rayon::prelude::*;

/// The share of a buffer one core populates: large enough that a call's cost is nothing beside
/// its page work, small enough that a large tensor spreads over the cores (one call for a whole
/// 47 MB tensor left the other core waiting: 1.05x the time of faulting pages in on two cores).
/// Pieces end on its multiples, the boundaries of x86-64's and arm64's 2 MiB huge pages.
const PIECE: usize = 2 << 20;

/// Buffers of at least this size are asked for huge pages first, as numpy asks for its arrays
/// (the same threshold): a huge page is zeroed and mapped in one step instead of 512.
const HUGE_FROM: usize = 4 << 20;

/// Backs the whole pages inside `buf` with writable memory now (huge pages where `buf` is
/// large), a piece per core at a time, leaving its contents as they are; unless its last whole
/// page is backed already (the allocator recycled it: then so is the rest). Where the kernel or
/// platform has no such advice, the pages fault in as written.
pub fn populate(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        let page = page_size();
        let at = buf.as_ptr() as usize;
        let (begin, end) = (at.next_multiple_of(page), (at + buf.len()) / page * page);
        if end <= begin || backed(end - page, page) {
            return;
        }
        let whole = &mut buf[begin - at..end - at];
        if whole.len() >= HUGE_FROM {
            let (lo, hi) = (begin.next_multiple_of(PIECE), end / PIECE * PIECE);
            if lo < hi {
                advise(&mut whole[lo - begin..hi - begin], libc::MADV_HUGEPAGE);
            }
        }
        // A buffer of one piece stays on this thread: a trip through the thread pool costs as
        // much as the work.
        let (head, rest) = whole.split_at_mut((begin.next_multiple_of(PIECE) - begin).min(whole.len()));
        advise(head, libc::MADV_POPULATE_WRITE);
        if rest.len() <= PIECE {
            advise(rest, libc::MADV_POPULATE_WRITE);
        } else {
            rest.par_chunks_mut(PIECE).for_each(|p| advise(p, libc::MADV_POPULATE_WRITE));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    #[allow(unsafe_code)]
    *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096))
}

/// Whether the page at `at` is backed by memory.
#[cfg(target_os = "linux")]
fn backed(at: usize, page: usize) -> bool {
    let mut resident = 0u8;
    // SAFETY: mincore reads the state of the page at `at` (inside a buffer the caller borrows)
    // and writes one byte into `resident`; it neither reads nor writes the page.
    #[allow(unsafe_code)]
    let asked = unsafe { libc::mincore(at as *mut libc::c_void, page, &mut resident) };
    asked == 0 && resident & 1 == 1
}

/// `advice` for the whole pages `range`, which starts on a page boundary.
#[cfg(target_os = "linux")]
fn advise(range: &mut [u8], advice: libc::c_int) {
    if range.is_empty() {
        return;
    }
    // SAFETY: `range` is borrowed mutably, so nothing else touches it meanwhile; both advices
    // used here (MADV_HUGEPAGE, MADV_POPULATE_WRITE) map pages or mark the range for huge ones
    // and change no byte. An error (EINVAL from a kernel before 5.14 or without transparent
    // huge pages) only leaves the pages as they were.
    #[allow(unsafe_code)]
    unsafe {
        libc::madvise(range.as_mut_ptr().cast(), range.len(), advice)
    };
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

    /// `len` bytes of memory the process never touched, its own mapping (an allocator might
    /// hand back pages already used), unmapped when dropped.
    #[cfg(target_os = "linux")]
    struct Fresh(&'static mut [u8]);

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    impl Fresh {
        fn new(len: usize) -> Fresh {
            // SAFETY: a new private anonymous mapping, which nothing else refers to.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(at, libc::MAP_FAILED);
            // SAFETY: `len` readable and writable bytes (zeros), owned by this value until drop.
            Fresh(unsafe { std::slice::from_raw_parts_mut(at.cast(), len) })
        }

        /// How many of the whole pages in `part` (of this mapping) are backed.
        fn backed(part: &[u8]) -> (usize, usize) {
            let page = super::page_size();
            let begin = (part.as_ptr() as usize).next_multiple_of(page);
            let pages = (part.as_ptr() as usize + part.len()) / page - begin / page;
            let mut r = vec![0u8; pages];
            // SAFETY: whole pages of a live mapping; mincore writes a byte per page into `r`.
            assert_eq!(unsafe { libc::mincore(begin as *mut libc::c_void, pages * page, r.as_mut_ptr()) }, 0);
            (r.iter().filter(|&&b| b & 1 == 1).count(), pages)
        }
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    impl Drop for Fresh {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer borrowed.
            unsafe { libc::munmap(self.0.as_mut_ptr().cast(), self.0.len()) };
        }
    }

    /// Fresh memory is backed after `populate`, every whole page of it, piece boundaries
    /// included, where the kernel has the advice (Linux 5.14 and later): a buffer of many
    /// pieces, one of a head and a piece, one inside a single piece.
    #[cfg(target_os = "linux")]
    #[test]
    #[allow(unsafe_code)]
    fn fresh_pages_are_backed() {
        let probe = Fresh::new(1 << 16);
        // SAFETY: one page of `probe`'s mapping, which is live.
        if unsafe { libc::madvise(probe.0.as_mut_ptr().cast(), 4096, libc::MADV_POPULATE_WRITE) } != 0 {
            return; // a kernel without the advice
        }
        for len in [64 << 20, 3 << 20, 1 << 20] {
            let fresh = Fresh::new(len);
            // A part that starts and ends inside pages, so that it has pieces of every kind: a
            // head before the first 2 MiB boundary, whole ones, a tail.
            let part = &mut fresh.0[12_345 + (len >> 6)..len - 54_321];
            assert_eq!(Fresh::backed(part).0, 0);
            super::populate(part);
            let (backed, pages) = Fresh::backed(part);
            assert_eq!(backed, pages, "populate left pages of a fresh {len}-byte buffer unbacked");
        }
    }

    /// A large fresh buffer gets huge pages, where the system has transparent huge pages for
    /// those who ask (not `never`). One is enough: compaction may fail on fragmented memory.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_fresh_buffers_get_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if !thp.contains("[always]") && !thp.contains("[madvise]") {
            return;
        }
        let fresh = Fresh::new(64 << 20);
        let (lo, hi) = (fresh.0.as_ptr() as usize, fresh.0.as_ptr() as usize + fresh.0.len());
        // Kilobytes in huge pages of the mappings that overlap the buffer.
        let huge_kb = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
            let mut inside = false;
            let mut kb = 0u64;
            for line in smaps.lines() {
                let range = line.split_once(' ').map_or("", |(r, _)| r).split_once('-');
                match range.map(|(a, b)| (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))) {
                    Some((Ok(a), Ok(b))) => inside = a < hi && lo < b,
                    _ if inside => {
                        if let Some(v) = line.strip_prefix("AnonHugePages:") {
                            kb += v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
                        }
                    }
                    _ => {}
                }
            }
            kb
        };
        assert_eq!(huge_kb(), 0);
        super::populate(fresh.0);
        assert!(huge_kb() >= 2048, "a fresh 64 MiB buffer got no huge page");
    }
}
