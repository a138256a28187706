// ---- rANS blocks (§6.2.6, §6.2.7, §6.4.2) with subgroup operations, where the adapter has them (appended to
// decode.wgsl behind `enable subgroups;`; `decode_blocks` is the path without). Same job
// records and results as `decode_blocks`. The invocation running state j is chosen by subgroup
// and lane (j = subgroup id · subgroup size + lane), so that a ballot's lane order is state
// order whatever the adapter's layout. A step's words go to the states below 2^16 in state
// order: each finds its own by the popcount of the ballot below its lane, plus the needs of the
// subgroups before it where a subgroup is narrower than the block's 32 states (lavapipe: 8),
// through workgroup memory. Symbols are packed four to a word by shuffles.
// Subgroups of at least 4 lanes dividing 32, or wider than 32; the host checks.

// Two steps' counts per subgroup: a step writes one half while a slow reader may still read
// the other.
var<workgroup> sg_needs: array<u32, 16>;

@compute @workgroup_size(32)
fn decode_blocks_subgroups(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(subgroup_id) sid: u32, @builtin(subgroup_invocation_id) lane: u32,
                           @builtin(subgroup_size) width: u32, @builtin(local_invocation_index) li: u32) {
    let g = wg.y * nwg.x + wg.x;
    // Uniform across the workgroup: every value below up to `x` depends on the block alone.
    if (g >= jobs[H_RBLOCKS]) {
        return;
    }
    let size = min(width, 32u);
    let j = sid * size + lane;
    let k = rblock(g);
    let words = k.words;
    let out_at = k.out_at;
    let chunk = k.chunk;
    // A subgroup wider than 32 has lanes past the block's states: they decode nothing.
    let live = j < 32u;
    var x = 0u;
    if (live) {
        x = blob_u32(k.states + 4u * j);
    }
    var pos = k.pos;
    let end = k.end;
    let first = k.first;
    var len = k.len;
    if (k.list != NO_MAP) {
        len = rblock_list(k, li);
    }
    let steps = (len + 31u) / 32u;
    let below = (1u << (lane & 31u)) - 1u;
    var ok = true;
    // The symbol this state decoded one step before (neighbour contexts, §6.2.7).
    var prev = 0u;
    for (var t = 0u; t < steps; t++) {
        let i = t * 32u + j;
        var y = x;
        var need = false;
        var sym = 0u;
        if (live && i < len) {
            let e = tables[rblock_table(k, i, prev) + (x & 4095u)];
            sym = e & 0xffu;
            prev = sym;
            y = ((e >> 8u) & 0xfffu) * (x >> 12u) + (x & 4095u) - (e >> 20u);
            need = y < 0x10000u;
        }
        let ballot = subgroupBallot(need).x;
        var before = countOneBits(ballot & below);
        // The subgroups' needs combined, the same code for one subgroup of 32 (a warp: its
        // barrier costs little) as for four of 8 (lavapipe, where CI tests it).
        let half = (t & 1u) * 8u;
        if (lane == 0u) {
            sg_needs[half + sid] = countOneBits(ballot);
        }
        workgroupBarrier();
        var taken = 0u;
        for (var s = 0u; s < 32u / size; s++) {
            let c = sg_needs[half + s];
            if (s < sid) {
                before += c;
            }
            taken += c;
        }
        if (pos + taken > end) {
            ok = false;
            break;
        }
        if (need) {
            y = (y << 16u) | blob_u16(words + 2u * (pos + before));
        }
        x = y;
        pos += taken;
        // The step's 32 symbols, four to a word; `first` and every step start on a word.
        let s1 = subgroupShuffle(sym, lane + 1u);
        let s2 = subgroupShuffle(sym, lane + 2u);
        let s3 = subgroupShuffle(sym, lane + 3u);
        if (live && (j & 3u) == 0u && j < len - t * 32u) {
            scratch[out_at + (first + t * 32u + j) / 4u] = sym | (s1 << 8u) | (s2 << 16u) | (s3 << 24u);
        }
    }
    if (!ok) {
        if (j == 0u) {
            fail(chunk, E_RBLOCK_SHORT);
        }
        return;
    }
    if (k.list != NO_MAP) {
        rblock_expand(k, li, len);
    }
    if (live && (pos != end || x != 0x10000u)) {
        fail(chunk, E_RBLOCK_END);
    }
}
