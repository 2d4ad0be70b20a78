//! Helpers shared by the integration tests.

use oxccl::exact::{coll_input, count_wrong, expected_output};
use oxccl::schedule::inplace_layout;
use oxccl::{Coll, Communicator, DataType, OpDesc, OpMem, ReduceOp};

/// Run `f` on every communicator at once, one thread each (threads as ranks); takes the
/// communicators by value (dropped after) or by reference.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn on_all<C, F>(comms: C, f: F)
where
    C: AsRef<[Communicator]>,
    F: Fn(&Communicator) + Sync,
{
    std::thread::scope(|s| {
        for c in comms.as_ref() {
            let f = &f;
            s.spawn(move || f(c));
        }
    });
}

/// Run `coll` through the untyped API on verifiable data (in place when `inplace`) and return
/// how many elements differ, bit for bit, from the expected output.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn run_and_count_wrong(
    c: &Communicator,
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    root: usize,
    inplace: bool,
    seed: u64,
) -> usize {
    let (n, r) = (c.size(), c.rank());
    let input = coll_input(coll, dt, op, n, r, count, root, seed);
    let want = expected_output(coll, dt, op, n, r, count, root, seed);
    let d = OpDesc { coll, dtype: dt, op, count, root };
    let es = dt.size();
    let got = if inplace {
        let (io, oo, len) = inplace_layout(coll, n, r, count, root).unwrap();
        let mut buf = vec![0u8; len * es];
        buf[io * es..io * es + input.len()].copy_from_slice(&input);
        c.run(d, OpMem::InPlace { buf: &mut buf, in_off: io * es, out_off: oo * es }).unwrap();
        buf[oo * es..oo * es + want.len()].to_vec()
    } else {
        let mut out = vec![0u8; want.len()];
        c.run(d, OpMem::Split { input: &input, output: &mut out }).unwrap();
        out
    };
    count_wrong(dt, &got, &want)
}

/// `n` communicators over libfabric with `cfg` (which names the provider), or `None` where
/// libfabric does not open here, said on stderr; unless `OXCCL_REQUIRE_OFI` is set (CI sets it),
/// where that fails the test.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn init_ofi_or_skip(n: usize, cfg: oxccl::Config) -> Option<Vec<Communicator>> {
    match Communicator::init_all_with_config(n, cfg) {
        Ok(c) => Some(c),
        Err(e) if e.kind == oxccl::ErrorKind::Unavailable && std::env::var_os("OXCCL_REQUIRE_OFI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}
