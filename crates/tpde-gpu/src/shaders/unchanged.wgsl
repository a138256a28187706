// ---- Mode 7's unchanged contexts (§6.4.2): a map entry of 0xff leaves the context's elements
// out (their byte is 0), and block k's states decode its other elements in order. Before the
// steps its 32 invocations list those elements (`rblock_list`); after them, they put the symbols,
// decoded one after another from the block's first byte, back at their elements
// (`rblock_expand`). Both walk the block in windows, each invocation counting its own elements
// and reading the others' counts through workgroup memory (both kernels call them, with their
// workgroup's invocation index `li`).
var<workgroup> rb_counts: array<u32, 32>;

fn rblock_coded(k: RBlock, e: u32) -> bool {
    return blob_byte(k.map + rblock_context(k, e)) != 0xffu;
}

// Lists block k's coded elements (offsets in the block) at scratch words list + first + 0, 1,
// …; returns how many, the same in every invocation.
fn rblock_list(k: RBlock, li: u32) -> u32 {
    var count = 0u;
    for (var at = 0u; at < k.len; at += 32u) {
        let e = at + li;
        let coded = e < k.len && rblock_coded(k, e);
        rb_counts[li] = select(0u, 1u, coded);
        workgroupBarrier();
        var before = 0u;
        var total = 0u;
        for (var s = 0u; s < 32u; s++) {
            let c = rb_counts[s];
            if (s < li) {
                before += c;
            }
            total += c;
        }
        if (coded) {
            scratch[k.list + k.first + count + before] = e;
        }
        count += total;
        workgroupBarrier();
    }
    storageBarrier();
    return count;
}

// Puts block k's `count` decoded symbols (at its plane's bytes first, first + 1, …) at its
// coded elements and 0 at the others, a word of 4 elements an invocation, in windows of 128
// elements from the last: a coded element's symbol is never after it, so a window reads only
// bytes no later window has written, and writes after every invocation has read.
fn rblock_expand(k: RBlock, li: u32, count: u32) {
    storageBarrier();
    let words = (k.len + 3u) / 4u;
    let plane = k.out_at * 4u + k.first;
    var after = 0u;
    for (var w = (words + 31u) / 32u; w > 0u; w--) {
        let q = (w - 1u) * 32u + li;
        var flags = 0u;
        var c = 0u;
        for (var b = 0u; b < 4u; b++) {
            let e = 4u * q + b;
            if (e < k.len && rblock_coded(k, e)) {
                flags |= 1u << b;
                c += 1u;
            }
        }
        rb_counts[li] = c;
        workgroupBarrier();
        // The coded elements of this window from this invocation's word on, and in all of it.
        var onward = 0u;
        var total = 0u;
        for (var s = 0u; s < 32u; s++) {
            let v = rb_counts[s];
            if (s >= li) {
                onward += v;
            }
            total += v;
        }
        var r = count - after - onward;
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            if ((flags & (1u << b)) != 0u) {
                let at = plane + r;
                word |= ((scratch[at / 4u] >> (8u * (at % 4u))) & 0xffu) << (8u * b);
                r += 1u;
            }
        }
        storageBarrier();
        workgroupBarrier();
        if (q < words) {
            scratch[k.out_at + k.first / 4u + q] = word;
        }
        after += total;
        storageBarrier();
        workgroupBarrier();
    }
}
