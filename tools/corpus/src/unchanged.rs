//! 1.11's unchanged contexts (spec §6.4.2): a mode-7 map entry of 0xFF leaves the elements of
//! that base context out (their byte is 0). A valid delta whose mode-7 records leave out the
//! contexts their planes never change, and each rule broken once: a map of 0xFF alone, and
//! 0xFF in the maps of the modes that do not allow it (0x04, 0x08).

use tpde_codec::planes::PlaneRecord;
use tpde_codec::rans::unchanged::UNCHANGED;
use tpde_codec::rans::{BlockLayout, Contexts, CONTEXT_BLOCK_SYMBOLS};
use tpde_format::{surgery, ErrorKind};

use crate::context_blocks::{base_contexts_of, context_blocks, table_len, with_neighbour_map_entry, BASE};
use crate::invalid::{bad, bad_delta};
use crate::Gen;

/// `delta-sub-context` of the context-blocks deltas whose mode-7 records leave out their
/// unchanged contexts.
const UNCHANGED_FILE: &str = "valid/delta-sub-context-blocks-unchanged.tpde";
const FROM: &str = "valid/delta-sub-context-blocks-1-11.tpde";
/// The mode-4 delta the lane case edits.
const LANES: &str = "valid/delta-xor-context-lanes-of-blocks-base.tpde";

pub fn valid(g: &mut Gen) {
    let file = g.get(FROM).bytes.clone();
    let mut out = file.clone();
    // Per re-coded record: its blocks' coded elements.
    let mut coded: Vec<Vec<usize>> = Vec::new();
    for (t, stored, record) in context_blocks(&file) {
        let PlaneRecord::BaseContextBlocks(model, layout) = record else { continue };
        let contexts = base_contexts_of(g, &file, t);
        let tables: Vec<u8> = contexts.iter().map(|&k| model.map()[usize::from(k)]).collect();
        let mut plane = vec![0u8; tables.len()];
        model.decode_given_blocks(&stored, &layout, &tables, &mut plane).expect("valid");
        // The contexts some element has, and those whose elements are all 0 here.
        let (mut present, mut busy) = ([false; 256], [false; 256]);
        for (&k, &p) in contexts.iter().zip(&plane) {
            present[usize::from(k)] = true;
            busy[usize::from(k)] |= p != 0;
        }
        let mut map = *model.map();
        for k in 0..256 {
            if present[k] && !busy[k] {
                map[k] = UNCHANGED;
            }
        }
        if !map.contains(&UNCHANGED) || map.iter().all(|&m| m == UNCHANGED) {
            continue;
        }
        let tables: Vec<u8> = contexts.iter().map(|&k| map[usize::from(k)]).collect();
        let recoded = Contexts::count_tables(map, &plane, &tables);
        let start = layout.ends - model.tables().iter().map(table_len).sum::<usize>() - 256;
        let mut s = stored[..start].to_vec();
        recoded.encode_given_blocks(&plane, &tables, &mut s);
        s.extend_from_slice(&stored[layout.words.end..]);
        out = surgery::with_chunk(&out, t, 0, &s).expect("surgery");
        coded.push(
            tables.chunks(CONTEXT_BLOCK_SYMBOLS).map(|b| b.iter().filter(|&&t| t != UNCHANGED).count()).collect(),
        );
    }
    assert!(coded.len() >= 2, "{FROM}: planes with unchanged contexts in both tensors");
    let blocks: Vec<String> = coded.iter().map(|c| format!("{c:?}")).collect();
    let description = format!(
        "{FROM} with each base-context block record whose plane has contexts of zero bytes alone re-coded to leave them out (map entry 0xFF), tables counted anew: coded elements per block {}",
        blocks.join(", ")
    );
    g.valid_derived(UNCHANGED_FILE, "§6.4.2", &description, FROM, out);
}

/// The map's offset in a mode-7 record of `stored` read as `model` and `layout`.
fn map_of(model: &Contexts, layout: &BlockLayout) -> usize {
    layout.ends - model.tables().iter().map(table_len).sum::<usize>() - 256
}

pub fn invalid(g: &mut Gen) {
    // Mode 7 with every entry 0xFF, and what a reader that took such a map would decode
    // cleanly: the first table (C = 1 were the 0xFF entries not counted), blocks of no word
    // whose states are 2^16. Such a reader would decode zeros and fail the content digest, in
    // another category.
    let file = g.get(UNCHANGED_FILE).bytes.clone();
    let (t, stored, record) = context_blocks(&file)
        .into_iter()
        .find(|(_, _, r)| matches!(r, PlaneRecord::BaseContextBlocks(m, _) if m.has_unchanged()))
        .expect("a record with unchanged contexts");
    let PlaneRecord::BaseContextBlocks(model, layout) = record else { unreachable!() };
    let map = map_of(&model, &layout);
    let mut s = stored[..map].to_vec();
    s.extend_from_slice(&[UNCHANGED; 256]);
    model.tables()[0].write(&mut s);
    let k = layout.blocks as usize;
    s.extend(std::iter::repeat_n(0u8, 4 * k));
    s.extend((0..32 * k).flat_map(|_| (1u32 << 16).to_le_bytes()));
    s.extend_from_slice(&stored[layout.words.end..]);
    bad_delta(
        g,
        "r25-context-blocks-map-all-unchanged",
        "R25",
        "a base-context block record (mode 7) whose map sends every context to 0xFF, unchanged, so names no table; one table follows, then blocks of no word whose states are 2^16 (what a reader taking the map would decode to zeros)",
        surgery::with_chunk(&file, t, 0, &s).expect("surgery"),
        BASE,
        ErrorKind::Malformed,
    );

    // Mode 4 with 0xFF for a context no element has, so that no symbol decodes differently.
    let file = g.get(LANES).bytes.clone();
    let dir = surgery::directory(&file).expect("a valid file");
    let c = &dir.tensors[0].chunks[0];
    let stored = file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec();
    let (w, n) = (dir.tensors[0].dtype.size() as usize, c.element_count as usize);
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, w, n).expect("valid");
    let (model, lanes) = records
        .iter()
        .find_map(|r| match r {
            PlaneRecord::BaseContexts(m, l) => Some((m.clone(), l.clone())),
            _ => None,
        })
        .expect("a mode-4 record");
    let map = lanes.states - 4 - model.tables().iter().map(table_len).sum::<usize>() - 256;
    assert_eq!(stored[map - 1], 4, "a mode-4 record");
    let contexts = base_contexts_of(g, &file, 0);
    let unused = (0..256).find(|&k| !contexts.contains(&(k as u8))).expect("a context no element has");
    let mut s = stored.clone();
    s[map + unused] = UNCHANGED;
    bad_delta(
        g,
        "r25-base-context-lanes-unchanged",
        "R25",
        "a base-context lane record (mode 4) whose map sends a context no base element has to 0xFF, which only mode 7 allows",
        surgery::with_chunk(&file, 0, 0, &s).expect("surgery"),
        BASE,
        ErrorKind::Malformed,
    );

    // Mode 8 with 0xFF for a symbol the plane never holds.
    bad(
        g,
        "r25-context-blocks-neighbour-map-unchanged",
        "R25",
        "a neighbour-context block record (mode 8) whose map sends a symbol the plane never holds to 0xFF, which only mode 7 allows",
        with_neighbour_map_entry(g, UNCHANGED),
        ErrorKind::Malformed,
    );
}
