// TPDE decode kernels (spec §6.2.3, §6.4, §6.5, §6.7). The host (plan.rs) turns a batch of chunks
// into `jobs`: a header of section offsets, then one record per job. Every kernel finds its job
// by a binary search over a prefix-sum array, so one dispatch serves every chunk of a batch.
//
// Order of dispatches, each in its own pass: build_tables, decode_lanes, decode_blocks,
// scan_blocks, unpack_blocks, finish, scatter. A kernel that finds the chunk malformed records an error code
// for it in `err` (the largest code wins); the host turns it into the reader's R25 error.

@group(0) @binding(0) var<storage, read> blob: array<u32>;
@group(0) @binding(1) var<storage, read> jobs: array<u32>;
@group(0) @binding(2) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(3) var<storage, read_write> tables: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read> base: array<u32>;
@group(0) @binding(6) var<storage, read_write> err: array<atomic<u32>>;

const WG: u32 = 64u;

// jobs header: counts, record offsets and prefix-sum offsets of each job kind.
const H_TABLES: u32 = 0u;
const H_TABLES_AT: u32 = 1u;
const H_LANE_RECS: u32 = 2u;
const H_LANE_AT: u32 = 3u;
const H_LANE_PREFIX: u32 = 4u;
const H_LANES: u32 = 5u;
const H_PACKED: u32 = 6u;
const H_PACKED_AT: u32 = 7u;
const H_BLOCK_PREFIX: u32 = 8u;
const H_BLOCKS: u32 = 9u;
const H_FINISH: u32 = 10u;
const H_FINISH_AT: u32 = 11u;
const H_FINISH_PREFIX: u32 = 12u;
const H_WORDS: u32 = 13u;
const H_SPARSE: u32 = 14u;
const H_SPARSE_AT: u32 = 15u;
const H_SPARSE_PREFIX: u32 = 16u;
const H_CHANGED: u32 = 17u;
const H_PLANES_AT: u32 = 18u;
const H_RBLOCK_RECS: u32 = 19u;
const H_RBLOCK_AT: u32 = 20u;
const H_RBLOCK_PREFIX: u32 = 21u;
const H_RBLOCKS: u32 = 22u;

// Record sizes in u32s (plan.rs writes the same layouts).
const LANE_REC: u32 = 11u;
const PACKED_REC: u32 = 8u;
const FINISH_REC: u32 = 16u;
const SPARSE_REC: u32 = 16u;
const PLANE_REC: u32 = 4u;
const RBLOCK_REC: u32 = 13u;

// finish modes
const M_COPY: u32 = 0u;
const M_COPY_BASE: u32 = 1u;
const M_MERGE: u32 = 2u;
const M_XOR: u32 = 3u;
const M_SUB: u32 = 4u;

// error codes (plan.rs has their messages)
const E_LANE_SHORT: u32 = 1u;
const E_LANE_END: u32 = 2u;
const E_WIDTH: u32 = 3u;
const E_BLOCK_SIZES: u32 = 4u;
const E_GAP_ZERO: u32 = 5u;
const E_PAST_END: u32 = 6u;
const E_PADDING: u32 = 7u;
const E_ORDER: u32 = 8u;
const E_ZERO_DELTA: u32 = 9u;
const E_RBLOCK_SHORT: u32 = 10u;
const E_RBLOCK_END: u32 = 11u;

// A plane or position source: bit 31 set for scratch, clear for blob; the rest a byte offset.
// Bit 30 set (and 31 clear): a sparse plane record (§6.2.5), the rest its index.
const SCRATCH: u32 = 0x80000000u;
const SPARSE_PLANE: u32 = 0x40000000u;

// A lane job with one table; otherwise the blob byte of its context map (§6.2.4). Also: a lane
// job whose contexts are not its base's (§6.4.1).
const NO_MAP: u32 = 0xffffffffu;

const RANS_L: u32 = 0x800000u;

fn thread_id(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * WG + lid;
}

fn blob_byte(i: u32) -> u32 {
    return (blob[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn blob_u32(i: u32) -> u32 {
    return blob_byte(i) | (blob_byte(i + 1u) << 8u) | (blob_byte(i + 2u) << 16u) | (blob_byte(i + 3u) << 24u);
}

fn scratch_byte(i: u32) -> u32 {
    return (scratch[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn base_byte(i: u32) -> u32 {
    return (base[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// The base context (§6.4.1) of the w-byte element at base byte `at`: the top byte of its
// `planes` transform (rotated left by one bit for a float).
fn base_context(at: u32, w: u32, float: bool) -> u32 {
    let top = base_byte(at + w - 1u);
    if (!float) {
        return top;
    }
    var below = top;
    if (w > 1u) {
        below = base_byte(at + w - 2u);
    }
    return ((top << 1u) | (below >> 7u)) & 0xffu;
}

fn src_byte(src: u32, i: u32) -> u32 {
    if ((src & SCRATCH) != 0u) {
        return scratch_byte((src & ~SCRATCH) + i);
    }
    if ((src & SPARSE_PLANE) != 0u) {
        return sparse_plane_byte(src & ~SPARSE_PLANE, i);
    }
    return blob_byte(src + i);
}

// Byte i of sparse plane j (§6.2.5): the byte listed at position i, or the fill byte. The host
// checked and uploaded the positions (u32s, increasing) and their bytes: a binary search.
// record: fill, count, positions (blob byte), values (blob byte)
fn sparse_plane_byte(j: u32, i: u32) -> u32 {
    let d = jobs[H_PLANES_AT] + j * PLANE_REC;
    let count = jobs[d + 1u];
    let positions = jobs[d + 2u];
    var lo = 0u;
    var hi = count;
    loop {
        if (lo >= hi) {
            break;
        }
        let mid = (lo + hi) / 2u;
        if (blob_u32(positions + 4u * mid) < i) {
            lo = mid + 1u;
        } else {
            hi = mid;
        }
    }
    if (lo < count && blob_u32(positions + 4u * lo) == i) {
        return blob_byte(jobs[d + 3u] + lo);
    }
    return jobs[d];
}

fn fail(chunk: u32, code: u32) {
    atomicMax(&err[chunk], code);
}

// The job of item x: the largest k < n with jobs[at + k] <= x, where jobs[at .. at + n + 1] is a
// nondecreasing prefix sum starting at 0 and ending above x.
fn find(at: u32, n: u32, x: u32) -> u32 {
    var lo = 0u;
    var hi = n;
    loop {
        if (hi - lo <= 1u) {
            break;
        }
        let mid = (lo + hi) / 2u;
        if (jobs[at + mid] <= x) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// ---- rANS tables: slot -> symbol | freq << 8 | start << 20, as the CPU decoder's (rans.rs).
// Dispatch (tables, 16): one thread per slot. jobs holds start << 16 | freq per symbol.
@compute @workgroup_size(256)
fn build_tables(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    let slot = wg.y * 256u + lid;
    let at = jobs[H_TABLES_AT] + t * 256u;
    // The largest symbol whose start is <= slot is present: absent symbols share the start of
    // the next present one, and none starts at 4096.
    var lo = 0u;
    var hi = 256u;
    loop {
        if (hi - lo <= 1u) {
            break;
        }
        let mid = (lo + hi) / 2u;
        if ((jobs[at + mid] >> 16u) <= slot) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let e = jobs[at + lo];
    tables[t * 4096u + slot] = lo | ((e & 0xffffu) << 8u) | ((e >> 16u) << 20u);
}

// ---- rANS lanes (§6.2.3, §6.2.4, §6.4.1): one thread per lane; word q of the plane belongs to
// lane q mod L, so neighbouring threads write neighbouring words. A context record's lane codes
// each symbol with table map[the symbol before it in the lane] (map[0] for its first); a
// base-context record's, symbol i with table map[base context of element i].
// record: first table, n, lanes, states (blob byte), ends (blob byte), bytes (blob byte), out
// (scratch word), chunk, map (blob byte, or NO_MAP), base contexts (the chunk's base byte, or
// NO_MAP), w | float << 8
@compute @workgroup_size(64)
fn decode_lanes(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let g = thread_id(wg, nwg, lid);
    if (g >= jobs[H_LANES]) {
        return;
    }
    let prefix = jobs[H_LANE_PREFIX];
    let r = find(prefix, jobs[H_LANE_RECS], g);
    let d = jobs[H_LANE_AT] + r * LANE_REC;
    let table = jobs[d] * 4096u;
    let n = jobs[d + 1u];
    let lanes = jobs[d + 2u];
    let chunk = jobs[d + 7u];
    let map = jobs[d + 8u];
    let given = jobs[d + 9u];
    let w = jobs[d + 10u] & 0xffu;
    let float = (jobs[d + 10u] >> 8u) != 0u;
    var t = table;
    if (map != NO_MAP) {
        t = table + blob_byte(map) * 4096u;
    }
    let lane = g - jobs[prefix + r];
    var x = blob_u32(jobs[d + 3u] + 4u * lane);
    var pos = 0u;
    if (lane > 0u) {
        pos = blob_u32(jobs[d + 4u] + 4u * (lane - 1u));
    }
    let end = blob_u32(jobs[d + 4u] + 4u * lane);
    let bytes = jobs[d + 5u];
    let out_at = jobs[d + 6u];
    let words = (n + 3u) / 4u;
    for (var q = lane; q < words; q += lanes) {
        var word = 0u;
        let m = min(4u, n - 4u * q);
        for (var k = 0u; k < m; k++) {
            if (given != NO_MAP) {
                t = table + blob_byte(map + base_context(given + (4u * q + k) * w, w, float)) * 4096u;
            }
            let e = tables[t + (x & 4095u)];
            word |= (e & 0xffu) << (8u * k);
            if (map != NO_MAP && given == NO_MAP) {
                t = table + blob_byte(map + (e & 0xffu)) * 4096u;
            }
            x = ((e >> 8u) & 0xfffu) * (x >> 12u) + (x & 4095u) - (e >> 20u);
            loop {
                if (x >= RANS_L) {
                    break;
                }
                if (pos >= end) {
                    fail(chunk, E_LANE_SHORT);
                    return;
                }
                x = (x << 8u) | blob_byte(bytes + pos);
                pos += 1u;
            }
        }
        scratch[out_at + q] = word;
    }
    if (pos != end || x != RANS_L) {
        fail(chunk, E_LANE_END);
    }
}

// ---- rANS blocks (§6.2.6, §6.2.7, §6.4.2): one workgroup of 32 invocations per block,
// invocation j running state j; a context record's symbol decodes with table map[its context]. A step pops a symbol from every state; the states left below 2^16 take the block's
// next words in state order, each finding its own by the popcount of the mask below it (the
// ballot a subgroup would give, here through workgroup memory: the path of adapters without
// subgroups; blocks_subgroups.wgsl has the one with). Symbols are packed four to a word through
// workgroup memory.
// record: first table, n, blocks, ends (blob byte), states (blob byte), words (blob byte), out
// (scratch word), chunk, map (blob byte, or NO_MAP), base contexts (the chunk's base byte, or
// NO_MAP for neighbour contexts), w | float << 8, symbols a block, the coded elements' list
// (scratch word, or NO_MAP where the map leaves no context unchanged)
var<workgroup> rb_need: atomic<u32>;
var<workgroup> rb_mask: u32;
// Two steps' symbols: a step writes one half while a slow reader may still read the other.
var<workgroup> rb_syms: array<u32, 64>;

fn blob_u16(i: u32) -> u32 {
    return blob_byte(i) | (blob_byte(i + 1u) << 8u);
}

// Block `g` of the batch's rANS block records, as both block kernels read it.
struct RBlock {
    table: u32,   // its table's first slot
    states: u32,  // blob byte of its 32 states
    words: u32,   // blob byte of its record's words
    pos: u32,     // its first word
    end: u32,     // the word after its last
    out_at: u32,  // scratch word of its record's plane
    first: u32,   // its first symbol in the plane
    len: u32,     // its symbols
    steps: u32,   // steps of 32 symbols
    chunk: u32,
    map: u32,     // blob byte of a base-context record's map, or NO_MAP
    given: u32,   // base byte of the chunk's first element (base contexts), or NO_MAP
    w: u32,
    float: bool,
    list: u32,    // scratch word of its record's list of coded elements (§6.4.2), or NO_MAP
}

// The first slot of the table that decodes symbol i of block k (the plane's symbol first + i):
// its record's one table; map[base context of its element] (§6.4.2); or map[the symbol its state
// decoded one step before, `prev`, 0 before the first] (§6.2.7).
fn rblock_table(k: RBlock, i: u32, prev: u32) -> u32 {
    if (k.map == NO_MAP) {
        return k.table;
    }
    if (k.list != NO_MAP) {
        return k.table + blob_byte(k.map + rblock_context(k, scratch[k.list + k.first + i])) * 4096u;
    }
    if (k.given == NO_MAP) {
        return k.table + blob_byte(k.map + prev) * 4096u;
    }
    return k.table + blob_byte(k.map + rblock_context(k, i)) * 4096u;
}

// The base context of element `e` of block k (its offset in the block).
fn rblock_context(k: RBlock, e: u32) -> u32 {
    return base_context(k.given + (k.first + e) * k.w, k.w, k.float);
}

fn rblock(g: u32) -> RBlock {
    let prefix = jobs[H_RBLOCK_PREFIX];
    let r = find(prefix, jobs[H_RBLOCK_RECS], g);
    let d = jobs[H_RBLOCK_AT] + r * RBLOCK_REC;
    let b = g - jobs[prefix + r];
    let ends = jobs[d + 3u];
    var pos = 0u;
    if (b > 0u) {
        pos = blob_u32(ends + 4u * (b - 1u));
    }
    let shape = jobs[d + 10u];
    let size = jobs[d + 11u];
    let first = b * size;
    let len = min(size, jobs[d + 1u] - first);
    return RBlock(jobs[d] * 4096u, jobs[d + 4u] + 128u * b, jobs[d + 5u], pos, blob_u32(ends + 4u * b),
                  jobs[d + 6u], first, len, (len + 31u) / 32u, jobs[d + 7u], jobs[d + 8u], jobs[d + 9u],
                  shape & 0xffu, ((shape >> 8u) & 0xffu) != 0u, jobs[d + 12u]);
}

@compute @workgroup_size(32)
fn decode_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) j: u32) {
    let g = wg.y * nwg.x + wg.x;
    // Uniform across the workgroup: every value below up to `x` depends on the block alone.
    if (g >= jobs[H_RBLOCKS]) {
        return;
    }
    let k = rblock(g);
    let words = k.words;
    let out_at = k.out_at;
    let chunk = k.chunk;
    var x = blob_u32(k.states + 4u * j);
    var pos = k.pos;
    let end = k.end;
    let first = k.first;
    var len = k.len;
    if (k.list != NO_MAP) {
        len = rblock_list(k, j);
    }
    let steps = (len + 31u) / 32u;
    var ok = true;
    // The symbol this state decoded one step before (neighbour contexts, §6.2.7).
    var prev = 0u;
    if (j == 0u) {
        atomicStore(&rb_need, 0u);
    }
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let i = t * 32u + j;
        var y = x;
        var need = false;
        var sym = 0u;
        if (i < len) {
            let e = tables[rblock_table(k, i, prev) + (x & 4095u)];
            sym = e & 0xffu;
            prev = sym;
            y = ((e >> 8u) & 0xfffu) * (x >> 12u) + (x & 4095u) - (e >> 20u);
            need = y < 0x10000u;
        }
        if (need) {
            atomicOr(&rb_need, 1u << j);
        }
        let half = (t & 1u) * 32u;
        rb_syms[half + j] = sym;
        workgroupBarrier();
        if (j == 0u) {
            rb_mask = atomicLoad(&rb_need);
            atomicStore(&rb_need, 0u);
        }
        let mask = workgroupUniformLoad(&rb_mask);
        let taken = countOneBits(mask);
        if (pos + taken > end) {
            ok = false;
            break;
        }
        if (need) {
            y = (y << 16u) | blob_u16(words + 2u * (pos + countOneBits(mask & ((1u << j) - 1u))));
        }
        x = y;
        pos += taken;
        // The step's 32 symbols, four to a word; `first` and every step start on a word.
        let q = (first + t * 32u) / 4u + j;
        if (j < 8u && 4u * j < len - t * 32u) {
            let k = half + 4u * j;
            scratch[out_at + q] = rb_syms[k] | (rb_syms[k + 1u] << 8u) | (rb_syms[k + 2u] << 16u) | (rb_syms[k + 3u] << 24u);
        }
    }
    if (!ok) {
        if (j == 0u) {
            fail(chunk, E_RBLOCK_SHORT);
        }
        return;
    }
    if (k.list != NO_MAP) {
        rblock_expand(k, j, len);
    }
    if (pos != end || x != 0x10000u) {
        fail(chunk, E_RBLOCK_END);
    }
}

// ---- packed positions (§6.5.1), step 1: where each block's data starts, by a workgroup prefix
// sum of the block sizes ⌈(len − 1)·width / 8⌉. One workgroup per chunk.
// record: positions (blob byte), positions_len, count, n, offsets (scratch word), positions
// (scratch word), chunk, 0
var<workgroup> sums: array<u32, 256>;
var<workgroup> carry: u32;

@compute @workgroup_size(256)
fn scan_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let d = jobs[H_PACKED_AT] + wg.x * PACKED_REC;
    let pos_at = jobs[d];
    let pos_len = jobs[d + 1u];
    let count = jobs[d + 2u];
    let offsets = jobs[d + 4u];
    let chunk = jobs[d + 6u];
    let blocks = (count + 127u) / 128u;
    if (lid == 0u) {
        carry = 0u;
    }
    workgroupBarrier();
    let tiles = (blocks + 255u) / 256u;
    for (var t = 0u; t < tiles; t++) {
        let b = t * 256u + lid;
        var size = 0u;
        if (b < blocks) {
            let len = min(128u, count - 128u * b);
            let width = blob_byte(pos_at + 5u * b + 4u);
            if (width > 32u || (width == 0u && len > 1u)) {
                fail(chunk, E_WIDTH);
            }
            size = ((len - 1u) * min(width, 32u) + 7u) / 8u;
        }
        sums[lid] = size;
        workgroupBarrier();
        for (var s = 1u; s < 256u; s <<= 1u) {
            var v = 0u;
            if (lid >= s) {
                v = sums[lid - s];
            }
            workgroupBarrier();
            sums[lid] += v;
            workgroupBarrier();
        }
        let c = carry;
        if (b < blocks) {
            scratch[offsets + b] = 5u * blocks + c + sums[lid] - size;
        }
        workgroupBarrier();
        if (lid == 255u) {
            carry = c + sums[255];
        }
        workgroupBarrier();
    }
    if (lid == 0u && 5u * blocks + carry != pos_len) {
        fail(chunk, E_BLOCK_SIZES);
    }
}

// `width` (1..=32) bits at bit `bit` of the bytes from `at`, most significant bit first.
fn read_bits(at: u32, bit: u32, width: u32) -> u32 {
    let i = at + (bit >> 3u);
    let skip = bit & 7u;
    let hi = (blob_byte(i) << 24u) | (blob_byte(i + 1u) << 16u) | (blob_byte(i + 2u) << 8u) | blob_byte(i + 3u);
    var top = hi << skip;
    if (skip > 0u) {
        top |= blob_byte(i + 4u) >> (8u - skip);
    }
    return top >> (32u - width);
}

// ---- packed positions, step 2: one thread per block of 128 positions.
@compute @workgroup_size(64)
fn unpack_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = thread_id(wg, nwg, lid);
    if (g >= jobs[H_BLOCKS]) {
        return;
    }
    let prefix = jobs[H_BLOCK_PREFIX];
    let r = find(prefix, jobs[H_PACKED], g);
    let d = jobs[H_PACKED_AT] + r * PACKED_REC;
    let pos_at = jobs[d];
    let count = jobs[d + 2u];
    let n = jobs[d + 3u];
    let positions = jobs[d + 5u];
    let chunk = jobs[d + 6u];
    let b = g - jobs[prefix + r];
    let len = min(128u, count - 128u * b);
    let width = min(blob_byte(pos_at + 5u * b + 4u), 32u);
    let data = pos_at + scratch[jobs[d + 4u] + b];
    var p = blob_u32(pos_at + 5u * b);
    if (p >= n) {
        fail(chunk, E_PAST_END);
        return;
    }
    scratch[positions + 128u * b] = p;
    for (var i = 1u; i < len; i++) {
        let gap = read_bits(data, (i - 1u) * width, width);
        if (gap == 0u) {
            fail(chunk, E_GAP_ZERO);
            return;
        }
        if (gap >= n - p) {
            fail(chunk, E_PAST_END);
            return;
        }
        p += gap;
        scratch[positions + 128u * b + i] = p;
    }
    let bits = (len - 1u) * width;
    let pad = (8u - (bits & 7u)) & 7u;
    if (pad > 0u && read_bits(data, bits, pad) != 0u) {
        fail(chunk, E_PADDING);
    }
}

// ---- elements as (low, high) 32-bit halves, `w` bytes wide.
fn wmask(w: u32) -> u32 {
    if (w >= 4u) {
        return 0xffffffffu;
    }
    return (1u << (8u * w)) - 1u;
}

// `v` with byte j (of 8, little-endian) set to `byte` (from 0).
fn with_byte(v: vec2<u32>, j: u32, byte: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(v.x | (byte << (8u * j)), v.y);
    }
    return vec2<u32>(v.x, v.y | (byte << (8u * (j - 4u))));
}

// Element e gathered from the w planes whose sources are at jobs[d + 8 ..].
fn gather(d: u32, w: u32, e: u32) -> vec2<u32> {
    var v = vec2<u32>(0u, 0u);
    for (var j = 0u; j < w; j++) {
        v = with_byte(v, j, src_byte(jobs[d + 8u + j], e));
    }
    return v;
}

fn rotr1(v: vec2<u32>, w: u32) -> vec2<u32> {
    if (w == 8u) {
        return vec2<u32>((v.x >> 1u) | (v.y << 31u), (v.y >> 1u) | (v.x << 31u));
    }
    return vec2<u32>((v.x >> 1u) | ((v.x & 1u) << (8u * w - 1u)), 0u);
}

fn unzigzag(v: vec2<u32>, w: u32) -> vec2<u32> {
    let neg = 0u - (v.x & 1u);
    if (w == 8u) {
        return vec2<u32>(((v.x >> 1u) | (v.y << 31u)) ^ neg, (v.y >> 1u) ^ neg);
    }
    return vec2<u32>(((v.x >> 1u) ^ neg) & wmask(w), 0u);
}

fn add(a: vec2<u32>, b: vec2<u32>, w: u32) -> vec2<u32> {
    let lo = a.x + b.x;
    if (w == 8u) {
        return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
    }
    return vec2<u32>(lo & wmask(w), 0u);
}

fn base_element(at: u32, w: u32) -> vec2<u32> {
    var v = vec2<u32>(0u, 0u);
    for (var j = 0u; j < w; j++) {
        v = with_byte(v, j, base_byte(at + j));
    }
    return v;
}

fn byte_of(v: vec2<u32>, j: u32) -> u32 {
    if (j < 4u) {
        return (v.x >> (8u * j)) & 0xffu;
    }
    return (v.y >> (8u * (j - 4u))) & 0xffu;
}

// ---- finish: planes merged and un-transformed (§6.2, §6.4), or bytes copied, into the output.
// One thread per output word; a word shared with a neighbouring chunk is merged atomically.
// record: mode, w, float, n, out (window byte), base (window byte), chunk, 0, sources[8]
@compute @workgroup_size(64)
fn finish(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let g = thread_id(wg, nwg, lid);
    if (g >= jobs[H_WORDS]) {
        return;
    }
    let prefix = jobs[H_FINISH_PREFIX];
    let r = find(prefix, jobs[H_FINISH], g);
    let d = jobs[H_FINISH_AT] + r * FINISH_REC;
    let mode = jobs[d];
    let w = jobs[d + 1u];
    let float = jobs[d + 2u] != 0u;
    let lo = jobs[d + 4u];
    let hi = lo + jobs[d + 3u] * w;
    let base_at = jobs[d + 5u];
    let word = lo / 4u + (g - jobs[prefix + r]);
    var bits = 0u;
    var mask = 0u;
    var cached = 0xffffffffu;
    var v = vec2<u32>(0u, 0u);
    for (var b = 0u; b < 4u; b++) {
        let at = word * 4u + b;
        if (at < lo || at >= hi) {
            continue;
        }
        let rel = at - lo;
        var byte = 0u;
        if (mode == M_COPY) {
            byte = src_byte(jobs[d + 8u], rel);
        } else if (mode == M_COPY_BASE) {
            byte = base_byte(base_at + rel);
        } else {
            let e = rel / w;
            if (e != cached) {
                cached = e;
                v = gather(d, w, e);
                if (mode == M_MERGE) {
                    if (float) {
                        v = rotr1(v, w);
                    }
                } else if (mode == M_XOR) {
                    if (float) {
                        v = rotr1(v, w);
                    }
                    v = v ^ base_element(base_at + e * w, w);
                } else {
                    v = add(unzigzag(v, w), base_element(base_at + e * w, w), w);
                }
            }
            byte = byte_of(v, rel - e * w);
        }
        bits |= byte << (8u * b);
        mask |= 0xffu << (8u * b);
    }
    if (mask == 0xffffffffu) {
        atomicStore(&out[word], bits);
    } else if (mask != 0u) {
        atomicAnd(&out[word], ~mask);
        atomicOr(&out[word], bits);
    }
}

// ---- sparse deltas (§6.5): each changed element XORed into the base copy `finish` made.
// record: w, float, n, count, positions (source, u32s), out (window byte), chunk, 0, sources[8]
@compute @workgroup_size(64)
fn scatter(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let g = thread_id(wg, nwg, lid);
    if (g >= jobs[H_CHANGED]) {
        return;
    }
    let prefix = jobs[H_SPARSE_PREFIX];
    let r = find(prefix, jobs[H_SPARSE], g);
    let d = jobs[H_SPARSE_AT] + r * SPARSE_REC;
    let w = jobs[d];
    let float = jobs[d + 1u] != 0u;
    let n = jobs[d + 2u];
    let positions = jobs[d + 4u];
    let chunk = jobs[d + 6u];
    let k = g - jobs[prefix + r];
    let p = src_u32(positions, k);
    if (p >= n) {
        fail(chunk, E_PAST_END);
        return;
    }
    // Within a packed block gaps are >= 1; across blocks the order is checked here.
    if (k > 0u && (k & 127u) == 0u && p <= src_u32(positions, k - 1u)) {
        fail(chunk, E_ORDER);
        return;
    }
    var v = gather(d, w, k);
    if (float) {
        v = rotr1(v, w);
    }
    if (v.x == 0u && v.y == 0u) {
        fail(chunk, E_ZERO_DELTA);
        return;
    }
    let at = jobs[d + 5u] + p * w;
    for (var j = 0u; j < w; j++) {
        let byte = byte_of(v, j);
        if (byte != 0u) {
            let i = at + j;
            atomicXor(&out[i >> 2u], byte << (8u * (i & 3u)));
        }
    }
}

// The k-th u32 of a source (4-byte aligned).
fn src_u32(src: u32, k: u32) -> u32 {
    if ((src & SCRATCH) != 0u) {
        return scratch[((src & ~SCRATCH) >> 2u) + k];
    }
    return blob[(src >> 2u) + k];
}
