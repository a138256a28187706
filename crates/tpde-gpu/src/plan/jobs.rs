//! The device jobs of a chunk's rANS plane records: lanes (spec §6.2.3, §6.2.4, §6.4.1) and
//! blocks (§6.2.6, §6.2.7, §6.4.2), with the tables they decode with.

use tpde_codec::rans::{BlockLayout, LaneLayout, Table};

use super::{ChunkWork, Src};

#[derive(Debug)]
pub(super) struct LaneJob {
    /// The first of the record's tables.
    pub(super) table: usize,
    /// Where a context record's map is in the upload (spec §6.2.4, §6.4.1).
    pub(super) map: Option<u64>,
    /// Whether the record's contexts are the base's (spec §6.4.1) rather than its symbols before.
    pub(super) base_contexts: bool,
    pub(super) n: u32,
    pub(super) lanes: u32,
    pub(super) states: u64,
    pub(super) ends: u64,
    pub(super) bytes: u64,
    pub(super) out_word: u64,
}

/// A block-form plane (spec §6.2.6, §6.4.2): one workgroup per block.
#[derive(Debug)]
pub(super) struct RansBlockJob {
    /// The first of the record's tables.
    pub(super) table: usize,
    /// Where a context record's map is in the upload (spec §6.2.7, §6.4.2).
    pub(super) map: Option<u64>,
    /// Whether the record's contexts are the base's (§6.4.2) rather than the symbol each state
    /// decoded before (§6.2.7).
    pub(super) base_contexts: bool,
    /// Symbols a block: 16384, or 65536 with contexts.
    pub(super) size: u32,
    /// Where the list of each block's coded elements goes, a scratch word an element, where
    /// the map leaves unchanged contexts out (§6.4.2).
    pub(super) list: Option<u64>,
    pub(super) n: u32,
    pub(super) blocks: u32,
    pub(super) ends: u64,
    pub(super) states: u64,
    pub(super) words: u64,
    pub(super) out_word: u64,
}

impl ChunkWork {
    /// Queues the lanes of one plane record (with its tables, and its map if a context record)
    /// for the device; returns where its decoded plane will be.
    pub(super) fn lane_job(
        &mut self,
        tables: &[Table],
        map: Option<u64>,
        base_contexts: bool,
        layout: &LaneLayout,
        stored_at: u64,
        n: usize,
    ) -> Src {
        let first = self.tables.len();
        self.tables.extend(tables.iter().map(table_entries));
        let out_word = self.alloc_scratch(n.div_ceil(4) as u64);
        self.lanes.push(LaneJob {
            table: first,
            map,
            base_contexts,
            n: n as u32,
            lanes: layout.lanes,
            states: stored_at + layout.states as u64,
            ends: stored_at + layout.ends as u64,
            bytes: stored_at + layout.bytes.start as u64,
            out_word,
        });
        Src::Scratch(out_word * 4)
    }

    /// Queues the blocks of one block-form plane record (with its tables, and its map if a
    /// context record, which may leave `unchanged` contexts out) for the device; returns where
    /// its decoded plane will be.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rans_block_job(
        &mut self,
        tables: &[Table],
        map: Option<u64>,
        base_contexts: bool,
        unchanged: bool,
        layout: &BlockLayout,
        stored_at: u64,
        n: usize,
    ) -> Src {
        let first = self.tables.len();
        self.tables.extend(tables.iter().map(table_entries));
        let out_word = self.alloc_scratch(n.div_ceil(4) as u64);
        let list = unchanged.then(|| self.alloc_scratch(n as u64));
        self.rans_blocks.push(RansBlockJob {
            table: first,
            map,
            base_contexts,
            size: layout.size as u32,
            list,
            n: n as u32,
            blocks: layout.blocks,
            ends: stored_at + layout.ends as u64,
            states: stored_at + layout.states as u64,
            words: stored_at + layout.words.start as u64,
            out_word,
        });
        Src::Scratch(out_word * 4)
    }
}

/// `start << 16 | freq` per symbol, what `build_tables` expands into the slot table.
fn table_entries(table: &Table) -> [u32; 256] {
    let starts = table.starts();
    let mut e = [0u32; 256];
    for (s, (&f, &st)) in table.freqs().iter().zip(&starts).enumerate() {
        e[s] = st << 16 | u32::from(f);
    }
    e
}
