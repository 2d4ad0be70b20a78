//! The part of `libibverbs`' ABI oxccl uses: the structures (`#[repr(C)]`, laid out as
//! rdma-core's `infiniband/verbs.h`; a test compiles a C program against the real header, when
//! it is installed, and compares every offset) and the functions, found with `dlsym` at run
//! time. The data-path calls (`ibv_post_send`, `ibv_poll_cq`, ...) are inline functions in the
//! header that call through `context->ops`; they are called the same way here.

#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_void};

pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_ERR: c_int = 6;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 8;
pub const IBV_QP_PKEY_INDEX: c_int = 16;
pub const IBV_QP_PORT: c_int = 32;
pub const IBV_QP_AV: c_int = 128;
pub const IBV_QP_PATH_MTU: c_int = 256;
pub const IBV_QP_TIMEOUT: c_int = 512;
pub const IBV_QP_RETRY_CNT: c_int = 1024;
pub const IBV_QP_RNR_RETRY: c_int = 2048;
pub const IBV_QP_RQ_PSN: c_int = 4096;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 8192;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 32768;
pub const IBV_QP_SQ_PSN: c_int = 65536;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 131072;
pub const IBV_QP_DEST_QPN: c_int = 1048576;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;

pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_WC_RECV: c_int = 128;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = 129;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvContext {
    pub device: *mut c_void,
    /// `struct ibv_context_ops`: 32 function pointers; see the `OP_*` indices.
    pub ops: [*const c_void; 32],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}

/// Indices in `ibv_context.ops`.
pub const OP_POLL_CQ: usize = 11;
pub const OP_REQ_NOTIFY_CQ: usize = 12;
pub const OP_POST_SRQ_RECV: usize = 20;
pub const OP_POST_SEND: usize = 25;

#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: u32,
    /// Big-endian immediate data.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// The rest of the `wr` union (atomic and UD variants), `qp_type` and `bind_mw`/`tso`.
    pub _rest: [u8; 76],
}

#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// 8-byte aligned: `dgid` is `union ibv_gid`, which holds two 64-bit integers.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_port_attr` (the fields read; the buffer is the full size).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Room for `ibv_port_attr` of later rdma-core versions (which append fields).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvPortAttrBuf {
    pub attr: IbvPortAttr,
    pub _spare: [u8; 64],
}

pub type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut IbvWc) -> c_int;
pub type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
pub type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
pub type PostSrqRecv = unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// The exported functions of `libibverbs.so.1`.
pub struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut IbvContext,
    pub close_device: unsafe extern "C" fn(*mut IbvContext) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttrBuf) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut IbvContext) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr,
    /// rdma-core 34 and later.
    pub reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut IbvMr>,
    pub dereg_mr: unsafe extern "C" fn(*mut IbvMr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut IbvContext) -> *mut IbvCompChannel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut IbvCompChannel) -> c_int,
    pub create_cq: unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut IbvCompChannel, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub get_cq_event: unsafe extern "C" fn(*mut IbvCompChannel, *mut *mut c_void, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut c_void, u32),
    pub create_srq: unsafe extern "C" fn(*mut c_void, *mut IbvSrqInitAttr) -> *mut c_void,
    pub destroy_srq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut IbvQpInitAttr) -> *mut IbvQp,
    pub modify_qp: unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut IbvQp) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(c_int) -> *const c_char,
}

#[allow(clippy::missing_transmute_annotations)]
impl Lib {
    /// Open `libibverbs.so.1` once per process.
    pub fn get() -> Result<&'static Lib, String> {
        static L: std::sync::OnceLock<Result<Lib, String>> = std::sync::OnceLock::new();
        L.get_or_init(Lib::open).as_ref().map_err(Clone::clone)
    }

    fn open() -> Result<Lib, String> {
        // SAFETY: dlopen with a NUL-terminated name; the handle is never closed (the functions
        // stay valid for the process).
        let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err("libibverbs.so.1 (rdma-core) is not installed".into());
        }
        let sym = |name: &std::ffi::CStr| {
            // SAFETY: dlsym on a live handle with a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        macro_rules! f {
            ($name:literal) => {{
                let p = sym($name).ok_or_else(|| format!("libibverbs.so.1 lacks {:?}", $name))?;
                // SAFETY: the symbol is libibverbs' function of that name, whose C signature
                // is the field's type (verbs.h, stable ABI IBVERBS_1.1 and later).
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        Ok(Lib {
            get_device_list: f!(c"ibv_get_device_list"),
            free_device_list: f!(c"ibv_free_device_list"),
            get_device_name: f!(c"ibv_get_device_name"),
            open_device: f!(c"ibv_open_device"),
            close_device: f!(c"ibv_close_device"),
            query_port: f!(c"ibv_query_port"),
            alloc_pd: f!(c"ibv_alloc_pd"),
            dealloc_pd: f!(c"ibv_dealloc_pd"),
            reg_mr: f!(c"ibv_reg_mr"),
            // SAFETY: as for `f!`: ibv_reg_dmabuf_mr's C signature.
            reg_dmabuf_mr: sym(c"ibv_reg_dmabuf_mr").map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) }),
            dereg_mr: f!(c"ibv_dereg_mr"),
            create_comp_channel: f!(c"ibv_create_comp_channel"),
            destroy_comp_channel: f!(c"ibv_destroy_comp_channel"),
            create_cq: f!(c"ibv_create_cq"),
            destroy_cq: f!(c"ibv_destroy_cq"),
            get_cq_event: f!(c"ibv_get_cq_event"),
            ack_cq_events: f!(c"ibv_ack_cq_events"),
            create_srq: f!(c"ibv_create_srq"),
            destroy_srq: f!(c"ibv_destroy_srq"),
            create_qp: f!(c"ibv_create_qp"),
            modify_qp: f!(c"ibv_modify_qp"),
            destroy_qp: f!(c"ibv_destroy_qp"),
            wc_status_str: f!(c"ibv_wc_status_str"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Our layouts, as "name offset" lines in the order the C program prints them.
    fn ours() -> Vec<(String, usize)> {
        let v = [
            ("ibv_context.ops", offset_of!(IbvContext, ops)),
            ("ibv_context.ops.poll_cq", offset_of!(IbvContext, ops) + 8 * OP_POLL_CQ),
            ("ibv_context.ops.req_notify_cq", offset_of!(IbvContext, ops) + 8 * OP_REQ_NOTIFY_CQ),
            ("ibv_context.ops.post_srq_recv", offset_of!(IbvContext, ops) + 8 * OP_POST_SRQ_RECV),
            ("ibv_context.ops.post_send", offset_of!(IbvContext, ops) + 8 * OP_POST_SEND),
            ("ibv_context.cmd_fd", offset_of!(IbvContext, cmd_fd)),
            ("ibv_comp_channel.fd", offset_of!(IbvCompChannel, fd)),
            ("ibv_qp.qp_num", offset_of!(IbvQp, qp_num)),
            ("ibv_mr.length", offset_of!(IbvMr, length)),
            ("ibv_mr.lkey", offset_of!(IbvMr, lkey)),
            ("ibv_mr.rkey", offset_of!(IbvMr, rkey)),
            ("ibv_sge", size_of::<IbvSge>()),
            ("ibv_send_wr", size_of::<IbvSendWr>()),
            ("ibv_send_wr.sg_list", offset_of!(IbvSendWr, sg_list)),
            ("ibv_send_wr.num_sge", offset_of!(IbvSendWr, num_sge)),
            ("ibv_send_wr.opcode", offset_of!(IbvSendWr, opcode)),
            ("ibv_send_wr.send_flags", offset_of!(IbvSendWr, send_flags)),
            ("ibv_send_wr.imm_data", offset_of!(IbvSendWr, imm_data)),
            ("ibv_send_wr.wr.rdma.remote_addr", offset_of!(IbvSendWr, remote_addr)),
            ("ibv_send_wr.wr.rdma.rkey", offset_of!(IbvSendWr, rkey)),
            ("ibv_recv_wr", size_of::<IbvRecvWr>()),
            ("ibv_recv_wr.num_sge", offset_of!(IbvRecvWr, num_sge)),
            ("ibv_wc", size_of::<IbvWc>()),
            ("ibv_wc.status", offset_of!(IbvWc, status)),
            ("ibv_wc.opcode", offset_of!(IbvWc, opcode)),
            ("ibv_wc.vendor_err", offset_of!(IbvWc, vendor_err)),
            ("ibv_wc.byte_len", offset_of!(IbvWc, byte_len)),
            ("ibv_wc.imm_data", offset_of!(IbvWc, imm_data)),
            ("ibv_wc.qp_num", offset_of!(IbvWc, qp_num)),
            ("ibv_qp_init_attr", size_of::<IbvQpInitAttr>()),
            ("ibv_qp_init_attr.cap", offset_of!(IbvQpInitAttr, cap)),
            ("ibv_qp_init_attr.qp_type", offset_of!(IbvQpInitAttr, qp_type)),
            ("ibv_qp_init_attr.sq_sig_all", offset_of!(IbvQpInitAttr, sq_sig_all)),
            ("ibv_srq_init_attr", size_of::<IbvSrqInitAttr>()),
            ("ibv_srq_init_attr.attr.max_wr", offset_of!(IbvSrqInitAttr, max_wr)),
            ("ibv_qp_attr", size_of::<IbvQpAttr>()),
            ("ibv_qp_attr.path_mtu", offset_of!(IbvQpAttr, path_mtu)),
            ("ibv_qp_attr.rq_psn", offset_of!(IbvQpAttr, rq_psn)),
            ("ibv_qp_attr.sq_psn", offset_of!(IbvQpAttr, sq_psn)),
            ("ibv_qp_attr.dest_qp_num", offset_of!(IbvQpAttr, dest_qp_num)),
            ("ibv_qp_attr.qp_access_flags", offset_of!(IbvQpAttr, qp_access_flags)),
            ("ibv_qp_attr.ah_attr", offset_of!(IbvQpAttr, ah_attr)),
            (
                "ibv_qp_attr.ah_attr.grh.sgid_index",
                offset_of!(IbvQpAttr, ah_attr) + offset_of!(IbvGlobalRoute, sgid_index),
            ),
            (
                "ibv_qp_attr.ah_attr.grh.traffic_class",
                offset_of!(IbvQpAttr, ah_attr) + offset_of!(IbvGlobalRoute, traffic_class),
            ),
            ("ibv_qp_attr.ah_attr.dlid", offset_of!(IbvQpAttr, ah_attr) + offset_of!(IbvAhAttr, dlid)),
            ("ibv_qp_attr.ah_attr.is_global", offset_of!(IbvQpAttr, ah_attr) + offset_of!(IbvAhAttr, is_global)),
            ("ibv_qp_attr.ah_attr.port_num", offset_of!(IbvQpAttr, ah_attr) + offset_of!(IbvAhAttr, port_num)),
            ("ibv_qp_attr.pkey_index", offset_of!(IbvQpAttr, pkey_index)),
            ("ibv_qp_attr.max_rd_atomic", offset_of!(IbvQpAttr, max_rd_atomic)),
            ("ibv_qp_attr.max_dest_rd_atomic", offset_of!(IbvQpAttr, max_dest_rd_atomic)),
            ("ibv_qp_attr.min_rnr_timer", offset_of!(IbvQpAttr, min_rnr_timer)),
            ("ibv_qp_attr.port_num", offset_of!(IbvQpAttr, port_num)),
            ("ibv_qp_attr.timeout", offset_of!(IbvQpAttr, timeout)),
            ("ibv_qp_attr.retry_cnt", offset_of!(IbvQpAttr, retry_cnt)),
            ("ibv_qp_attr.rnr_retry", offset_of!(IbvQpAttr, rnr_retry)),
            ("ibv_qp_attr.rate_limit", offset_of!(IbvQpAttr, rate_limit)),
            ("ibv_port_attr", size_of::<IbvPortAttr>()),
            ("ibv_port_attr.active_mtu", offset_of!(IbvPortAttr, active_mtu)),
            ("ibv_port_attr.lid", offset_of!(IbvPortAttr, lid)),
            ("ibv_port_attr.link_layer", offset_of!(IbvPortAttr, link_layer)),
        ];
        v.iter().map(|(n, o)| (n.to_string(), *o)).collect()
    }

    /// The C program printing the same names from rdma-core's header.
    fn c_program() -> String {
        let mut c =
            String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void){\n");
        for (name, _) in ours() {
            let (ty, field) = match name.split_once('.') {
                Some((t, f)) => (t.to_string(), Some(f.to_string())),
                None => (name.clone(), None),
            };
            match field {
                Some(f) => c += &format!("printf(\"{name} %zu\\n\", offsetof(struct {ty}, {f}));\n"),
                None => c += &format!("printf(\"{name} %zu\\n\", sizeof(struct {ty}));\n"),
            }
        }
        let consts = [
            "IBV_QPT_RC",
            "IBV_QPS_INIT",
            "IBV_QPS_RTR",
            "IBV_QPS_RTS",
            "IBV_QPS_ERR",
            "IBV_QP_STATE",
            "IBV_QP_ACCESS_FLAGS",
            "IBV_QP_PKEY_INDEX",
            "IBV_QP_PORT",
            "IBV_QP_AV",
            "IBV_QP_PATH_MTU",
            "IBV_QP_TIMEOUT",
            "IBV_QP_RETRY_CNT",
            "IBV_QP_RNR_RETRY",
            "IBV_QP_RQ_PSN",
            "IBV_QP_MAX_QP_RD_ATOMIC",
            "IBV_QP_MIN_RNR_TIMER",
            "IBV_QP_SQ_PSN",
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            "IBV_QP_DEST_QPN",
            "IBV_ACCESS_LOCAL_WRITE",
            "IBV_ACCESS_REMOTE_WRITE",
            "IBV_ACCESS_REMOTE_READ",
            "IBV_WR_RDMA_WRITE",
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            "IBV_WR_SEND",
            "IBV_SEND_SIGNALED",
            "IBV_WC_RECV",
            "IBV_WC_RECV_RDMA_WITH_IMM",
            "IBV_LINK_LAYER_ETHERNET",
        ];
        for k in consts {
            c += &format!("printf(\"{k} %ld\\n\", (long){k});\n");
        }
        c + "return 0;}\n"
    }

    fn our_consts() -> Vec<(&'static str, i64)> {
        vec![
            ("IBV_QPT_RC", IBV_QPT_RC as i64),
            ("IBV_QPS_INIT", IBV_QPS_INIT as i64),
            ("IBV_QPS_RTR", IBV_QPS_RTR as i64),
            ("IBV_QPS_RTS", IBV_QPS_RTS as i64),
            ("IBV_QPS_ERR", IBV_QPS_ERR as i64),
            ("IBV_QP_STATE", IBV_QP_STATE as i64),
            ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as i64),
            ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as i64),
            ("IBV_QP_PORT", IBV_QP_PORT as i64),
            ("IBV_QP_AV", IBV_QP_AV as i64),
            ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as i64),
            ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as i64),
            ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as i64),
            ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as i64),
            ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as i64),
            ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as i64),
            ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as i64),
            ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as i64),
            ("IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC as i64),
            ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as i64),
            ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as i64),
            ("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as i64),
            ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ as i64),
            ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as i64),
            ("IBV_WR_RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM as i64),
            ("IBV_WR_SEND", IBV_WR_SEND as i64),
            ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as i64),
            ("IBV_WC_RECV", IBV_WC_RECV as i64),
            ("IBV_WC_RECV_RDMA_WITH_IMM", IBV_WC_RECV_RDMA_WITH_IMM as i64),
            ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as i64),
        ]
    }

    /// Every offset, size and constant used here equals rdma-core's, compiled from
    /// `infiniband/verbs.h` (skipped without the header unless `OXCCL_REQUIRE_VERBS_HEADER`;
    /// CI installs it for this check only: nothing is built against it).
    #[test]
    fn layouts_match_rdma_core_headers() {
        let inc = std::env::var("OXCCL_VERBS_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
        if !std::path::Path::new(&inc).join("infiniband/verbs.h").exists() {
            assert!(std::env::var_os("OXCCL_REQUIRE_VERBS_HEADER").is_none(), "no infiniband/verbs.h under {inc}");
            eprintln!("skipped: rdma-core's headers are not installed");
            return;
        }
        let dir = std::env::temp_dir().join(format!("oxccl-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("l.c"), c_program()).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = std::process::Command::new(cc)
            .args(["-I", &inc, "-o"])
            .arg(dir.join("l"))
            .arg(dir.join("l.c"))
            .status()
            .expect("a C compiler");
        assert!(st.success(), "the layout program did not compile");
        let out = std::process::Command::new(dir.join("l")).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let theirs: std::collections::HashMap<&str, i64> =
            text.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k, v.trim().parse().unwrap())).collect();
        for (name, off) in ours() {
            assert_eq!(theirs.get(name.as_str()).copied(), Some(off as i64), "{name}");
        }
        for (name, v) in our_consts() {
            assert_eq!(theirs.get(name).copied(), Some(v), "{name}");
        }
    }
}
