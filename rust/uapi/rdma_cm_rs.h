/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * rdma_cm_rs: ioctl ABI of /dev/rdma_cm_rs, an in-kernel RDMA CM consumer
 * driven from user space.  See Documentation/rdma_cm_rs/ioctl-abi.rst.
 *
 * Rules that hold for every structure here:
 *  - sizes and offsets are identical for 32- and 64-bit user space: user
 *    pointers travel as __u64, every field is naturally aligned, padding is
 *    explicit and named "reserved";
 *  - reserved fields and unused bytes of an address must be zero, else the
 *    command fails with -EINVAL, so that they can be given meaning later;
 *  - a command number encodes its structure's size, and the kernel matches
 *    numbers exactly: the same number with another size or direction is an
 *    unknown command;
 *  - unknown commands fail with -ENOTTY, bad user pointers with -EFAULT.
 */
#ifndef _UAPI_RDMA_CM_RS_H
#define _UAPI_RDMA_CM_RS_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define RDMA_CM_RS_ABI_VERSION 7
#define RDMA_CM_RS_DEVICE_NAME "rdma_cm_rs"

/* Largest private data any CM message can carry (the IB CM's RTU: 224). */
#define RDMA_CM_RS_MAX_PRIVATE_DATA 256
/* Largest message SEND/RECV move; the module keeps receives of this size posted. */
#define RDMA_CM_RS_MAX_MESSAGE 4096
/* Receive buffers the module keeps posted on each connection. */
#define RDMA_CM_RS_RECV_DEPTH 16
/* SENDs one connection may have in flight (RDMA_CM_RS_SEND_NOWAIT). */
#define RDMA_CM_RS_SEND_WINDOW 16
/* Wait for ever (GET_EVENT, RECV). */
#define RDMA_CM_RS_TIMEOUT_INFINITE 0xffffffffU

/* Port spaces (enum rdma_ucm_port_space). */
#define RDMA_CM_RS_PS_IPOIB 0x0002
#define RDMA_CM_RS_PS_IB 0x013F
#define RDMA_CM_RS_PS_TCP 0x0106
#define RDMA_CM_RS_PS_UDP 0x0111

/* QP types (enum ib_qp_type). */
#define RDMA_CM_RS_QPT_RC 2
#define RDMA_CM_RS_QPT_UD 4

/*
 * A socket address exactly as user space builds it: a struct sockaddr_in or
 * sockaddr_in6 (AF_IB is reserved for later), in network byte order, followed
 * by zeros up to 128 bytes.  family == 0 means "no address".
 */
struct rdma_cm_rs_sockaddr {
	__u8 bytes[128];
};

/*
 * Connection parameters (struct rdma_conn_param).  On CONNECT and ACCEPT the
 * module owns the QP, so qp_num and srq are ignored (QUERY reports the QP
 * number); in events they are what the peer sent.  private_data_len is what
 * the CM reported:
 * the CM pads received private data (REQ to 56 bytes, REP to 196, REJ to 148
 * over IB/RoCE), so applications encode their own length in the payload.
 */
struct rdma_cm_rs_conn_param {
	__u32 qp_num;			/* 24 bits */
	__u16 private_data_len;
	__u8 responder_resources;
	__u8 initiator_depth;
	__u8 flow_control;
	__u8 retry_count;		/* 0..7 */
	__u8 rnr_retry_count;		/* 0..7, 7 = infinite */
	__u8 srq;
	__u32 reserved;
	__u8 private_data[RDMA_CM_RS_MAX_PRIVATE_DATA];
};

/* An event: RDMA_CM_RS_IOC_GET_EVENT. */
struct rdma_cm_rs_event {
	__u64 context;			/* the id's create-time context */
	__u32 id;			/* handle of the id the event is for */
	__u32 event;			/* enum rdma_cm_event_type (RDMA_CM_EVENT_*) */
	__s32 status;			/* 0 or a negative errno; REJECTED: the reject reason */
	__u32 new_id;			/* CONNECT_REQUEST: handle of the new id, else 0 */
	__u32 ud_qp_num;		/* UD ESTABLISHED (SIDR reply): the peer's QP */
	__u32 ud_qkey;			/* ... and its Q_Key */
	struct rdma_cm_rs_conn_param param;
	__u32 ud_peer;			/* UD ESTABLISHED: the peer's handle for UD_SEND */
	__u32 reserved[3];
};

/*
 * Synchronous ids (created with RDMA_CM_RS_ID_SYNC, see "Synchronous ids"
 * in ioctl-abi.rst): RESOLVE_ADDR, RESOLVE_ROUTE, CONNECT, ACCEPT (RC) and
 * DISCONNECT block until the event that ends them and return it here; the
 * ioctl fails with the event's errno if it reports a failure (REJECTED:
 * -ECONNREFUSED), the event still returned.  On other ids timeout_ms must
 * be 0 and nothing is written back.
 */
#define RDMA_CM_RS_SYNC_EVENT (1U << 0)	/* out: event holds the event that ended the call */
struct rdma_cm_rs_sync {
	__u32 timeout_ms;		/* in: longest wait; 0 = until the event */
	__u32 flags;			/* out: RDMA_CM_RS_SYNC_EVENT */
	struct rdma_cm_rs_event event;	/* out */
};

/* RDMA_CM_RS_IOC_INFO */
struct rdma_cm_rs_info {
	__u32 abi_version;		/* RDMA_CM_RS_ABI_VERSION */
	__u32 max_private_data;		/* RDMA_CM_RS_MAX_PRIVATE_DATA */
	__u32 max_message;		/* RDMA_CM_RS_MAX_MESSAGE */
	__u32 max_ids;			/* ids one file may hold */
	__u32 recv_depth;		/* RDMA_CM_RS_RECV_DEPTH */
	__u32 max_ud_peers;		/* RDMA_CM_RS_MAX_UD_PEERS */
	__u32 send_window;		/* RDMA_CM_RS_SEND_WINDOW */
	__u32 max_mcast_groups;		/* RDMA_CM_RS_MAX_MCAST_GROUPS */
	__u32 reserved[8];
};

/* RDMA_CM_RS_IOC_CREATE_ID */
#define RDMA_CM_RS_ID_SYNC (1U << 0)	/* synchronous: its events never reach GET_EVENT */
/*
 * Busy-polling: the calls that wait for the connection's completions (RECV,
 * SEND, the memory work) poll its CQ in the caller's task for the first
 * millisecond of a wait, then sleep until the device notifies one, as the
 * waits of other ids do at once.  The ids of a busy-polling listener's
 * requests busy-poll too.
 */
#define RDMA_CM_RS_ID_BUSY_POLL (1U << 1)
struct rdma_cm_rs_create_id {
	__u64 context;			/* in: returned with every event of the id */
	__u32 port_space;		/* in: RDMA_CM_RS_PS_* */
	__u32 qp_type;			/* in: RDMA_CM_RS_QPT_* */
	__u32 id;			/* out: handle, never 0 */
	__u32 flags;			/* in: RDMA_CM_RS_ID_* */
};

/* RDMA_CM_RS_IOC_DESTROY_ID */
struct rdma_cm_rs_id_cmd {
	__u32 id;
	__u32 reserved;
};

/* RDMA_CM_RS_IOC_BIND */
struct rdma_cm_rs_bind {
	__u32 id;
	__u32 reserved;
	struct rdma_cm_rs_sockaddr addr;
};

/* RDMA_CM_RS_IOC_RESOLVE_ADDR: completes with ADDR_RESOLVED or ADDR_ERROR. */
struct rdma_cm_rs_resolve_addr {
	__u32 id;
	__u32 timeout_ms;		/* 1..60000 */
	struct rdma_cm_rs_sockaddr src;	/* optional: family 0 = any */
	struct rdma_cm_rs_sockaddr dst;
	struct rdma_cm_rs_sync sync;
};

/* RDMA_CM_RS_IOC_RESOLVE_ROUTE: completes with ROUTE_RESOLVED or ROUTE_ERROR. */
struct rdma_cm_rs_resolve_route {
	__u32 id;
	__u32 timeout_ms;		/* 1..60000 */
	struct rdma_cm_rs_sync sync;
};

/* RDMA_CM_RS_IOC_LISTEN */
struct rdma_cm_rs_listen {
	__u32 id;
	__u32 backlog;			/* 1..1024, 0 takes 1024; enforced by the module */
};

/*
 * RDMA_CM_RS_IOC_CONNECT: after ROUTE_RESOLVED.  The module creates the QP
 * (RC, RDMA_CM_RS_RECV_DEPTH receives posted).
 */
struct rdma_cm_rs_connect {
	__u32 id;
	__u32 reserved;
	struct rdma_cm_rs_conn_param param;
	struct rdma_cm_rs_sync sync;
};

/* RDMA_CM_RS_IOC_ACCEPT: on an id delivered by a CONNECT_REQUEST event. */
#define RDMA_CM_RS_ACCEPT_REQUEST_PARAM (1U << 0) /* use the request's values (rdma_accept(id, NULL)) */
struct rdma_cm_rs_accept {
	__u32 id;
	__u32 flags;			/* RDMA_CM_RS_ACCEPT_* */
	struct rdma_cm_rs_conn_param param; /* ignored with ACCEPT_REQUEST_PARAM */
	struct rdma_cm_rs_sync sync;	/* RC ids; a UD accept writes no event */
};

/* RDMA_CM_RS_IOC_DISCONNECT */
struct rdma_cm_rs_disconnect {
	__u32 id;
	__u32 reserved;
	struct rdma_cm_rs_sync sync;
};

/*
 * RDMA_CM_RS_IOC_GET_REQUEST: the oldest connection request of a
 * synchronous listener (rdma_get_request(3)); the new id is synchronous too.
 */
struct rdma_cm_rs_get_request {
	__u32 id;			/* the listener */
	__u32 timeout_ms;		/* 0 = do not wait; RDMA_CM_RS_TIMEOUT_INFINITE */
	struct rdma_cm_rs_event event;	/* out: CONNECT_REQUEST, new_id set */
};

/* RDMA_CM_RS_IOC_REJECT */
struct rdma_cm_rs_reject {
	__u32 id;
	__u8 reason;			/* IB CM reject reason; 0 = consumer defined (28) */
	__u8 reserved[1];
	__u16 private_data_len;		/* <= 148 */
	__u8 private_data[RDMA_CM_RS_MAX_PRIVATE_DATA];
};

/* RDMA_CM_RS_IOC_SET_OPTION */
enum rdma_cm_rs_option {
	RDMA_CM_RS_OPT_TOS = 1,		/* 0..255, any state before connect/listen */
	RDMA_CM_RS_OPT_REUSEADDR = 2,	/* 0/1; 1 refused on a listener, 0 once bound */
	RDMA_CM_RS_OPT_AFONLY = 3,	/* 0/1, while idle or bound */
	RDMA_CM_RS_OPT_ACK_TIMEOUT = 4,	/* 0..31: 4.096 us * 2^t, RC only */
	RDMA_CM_RS_OPT_MIN_RNR_TIMER = 5, /* 0..31 (IB encoding) */
};
struct rdma_cm_rs_set_option {
	__u32 id;
	__u32 option;			/* enum rdma_cm_rs_option */
	__u64 value;
};

/* RDMA_CM_RS_IOC_QUERY */
struct rdma_cm_rs_query {
	__u32 id;			/* in */
	__u32 state;			/* out: enum rdma_cm_rs_state */
	__u32 port_space;
	__u32 qp_type;
	__u32 qp_num;			/* 0 while there is no QP */
	__u32 port_num;			/* 0 while not bound to a device */
	__u8 responder_resources;	/* negotiated, once connected */
	__u8 initiator_depth;
	__u8 tos;
	__u8 tos_set;
	__u32 backlog;			/* listeners */
	struct rdma_cm_rs_sockaddr src;
	struct rdma_cm_rs_sockaddr dst;
	char device[64];		/* NUL-terminated, empty while unbound */
	__u32 max_datagram;		/* UD ids with a QP: largest UD_SEND (path MTU) */
	__u32 qkey;			/* UD ids with a QP: the QP's Q_Key */
	__u64 reserved[3];
};

/* States reported by RDMA_CM_RS_IOC_QUERY (the CM's enum rdma_cm_state). */
enum rdma_cm_rs_state {
	RDMA_CM_RS_IDLE = 0,
	RDMA_CM_RS_ADDR_QUERY,
	RDMA_CM_RS_ADDR_RESOLVED,
	RDMA_CM_RS_ROUTE_QUERY,
	RDMA_CM_RS_ROUTE_RESOLVED,
	RDMA_CM_RS_CONNECT,
	RDMA_CM_RS_DISCONNECT,
	RDMA_CM_RS_ADDR_BOUND,
	RDMA_CM_RS_LISTEN,
	RDMA_CM_RS_DEVICE_REMOVAL,
	RDMA_CM_RS_DESTROYING,
};

struct rdma_cm_rs_get_event {
	__u32 timeout_ms;		/* in: 0 = do not wait; RDMA_CM_RS_TIMEOUT_INFINITE */
	__u32 reserved;
	struct rdma_cm_rs_event event;	/* out */
};

/*
 * RDMA_CM_RS_IOC_SEND: one message, returns after its completion; with
 * RDMA_CM_RS_SEND_NOWAIT once it is posted (at most RDMA_CM_RS_SEND_WINDOW
 * in flight: beyond, the call waits for the oldest to complete).  The
 * failure of a NOWAIT send is returned by the next SEND, which then sends
 * nothing.
 */
#define RDMA_CM_RS_SEND_NOWAIT (1U << 0)
struct rdma_cm_rs_send {
	__u32 id;
	__u32 len;			/* 1..RDMA_CM_RS_MAX_MESSAGE */
	__u64 buf;			/* user pointer */
	__u32 timeout_ms;		/* wait for the completion (NOWAIT: for a free slot); 0 = 5000 */
	__u32 flags;			/* RDMA_CM_RS_SEND_NOWAIT */
};

/* RDMA_CM_RS_IOC_RECV: the oldest message received on the connection. */
struct rdma_cm_rs_recv {
	__u32 id;
	__u32 len;			/* in: buffer size; out: message length */
	__u64 buf;			/* user pointer */
	__u32 timeout_ms;		/* 0 = do not wait; RDMA_CM_RS_TIMEOUT_INFINITE */
	__u32 reserved;
};

/*
 * RDMA_CM_RS_IOC_SEND_RECV: a request and its answer in one call: a SEND
 * with RDMA_CM_RS_SEND_NOWAIT, then a RECV.  timeout_ms bounds each half
 * (the wait for a free send slot, then the wait for the answer); 0 = wait
 * for neither.  Once the send is posted, sent is 1, also when the receive
 * half fails (its errors: ETIMEDOUT, EAGAIN, EINTR, EMSGSIZE, ENOTCONN,
 * EFAULT, as RECV's, with EINTR for a signal: the call is not restarted,
 * which would send again).
 */
struct rdma_cm_rs_send_recv {
	__u32 id;
	__u32 send_len;			/* 1..RDMA_CM_RS_MAX_MESSAGE */
	__u64 send_buf;			/* user pointer */
	__u64 recv_buf;			/* user pointer */
	__u32 recv_len;			/* in: buffer size; out: the answer's length */
	__u32 timeout_ms;		/* each half; 0 = do not wait; RDMA_CM_RS_TIMEOUT_INFINITE */
	__u32 sent;			/* in: 0; out: 1 once the send is posted */
	__u32 reserved;
};

/*
 * Registered memory and RDMA READ/WRITE, on a connection the module made
 * (after CONNECT or ACCEPT).  A region is module memory registered with fast
 * registration (FRWR) on the connection's QP; its handle is local to the id.
 * The QP's RDMA READ depth comes from the connection parameters: a side that
 * issues READs needs initiator_depth >= 1, a side that serves them
 * responder_resources >= 1.
 */
#define RDMA_CM_RS_MAX_MR_LEN (1U << 20)	/* bytes in one region */
#define RDMA_CM_RS_MAX_MRS 8			/* regions per connection */

#define RDMA_CM_RS_ACCESS_REMOTE_READ (1U << 0)
#define RDMA_CM_RS_ACCESS_REMOTE_WRITE (1U << 1)

/*
 * RDMA_CM_RS_IOC_MR_REG: allocates a zeroed region, registers it with the
 * given remote access under a fresh key, and returns after the registration
 * completed.  addr and rkey are what the peer puts in its work requests.
 */
struct rdma_cm_rs_mr_reg {
	__u32 id;
	__u32 access;			/* in: RDMA_CM_RS_ACCESS_* */
	__u32 length;			/* in: 1..RDMA_CM_RS_MAX_MR_LEN */
	__u32 timeout_ms;		/* in: 0 = 5000 */
	__u64 addr;			/* out */
	__u32 rkey;			/* out */
	__u32 mr;			/* out: handle, never 0 */
	__u64 reserved[2];
};

/*
 * RDMA_CM_RS_IOC_MR_DEREG: invalidates the registration (LOCAL_INV), then
 * deregisters and frees the region.  Once it returns the peer's key grants
 * nothing: its accesses fail with a remote access error.
 */
struct rdma_cm_rs_mr_cmd {
	__u32 id;
	__u32 mr;
	__u32 timeout_ms;		/* for the invalidation; 0 = 5000 */
	__u32 reserved;
};

/* RDMA_CM_RS_IOC_MR_WRITE (user to region), RDMA_CM_RS_IOC_MR_READ (region to user). */
struct rdma_cm_rs_mr_copy {
	__u32 id;
	__u32 mr;
	__u32 offset;			/* offset + len <= the region's length */
	__u32 len;			/* >= 1 */
	__u64 buf;			/* user pointer */
};

/*
 * RDMA_CM_RS_IOC_RDMA: one RDMA READ (peer memory into the region) or WRITE
 * (the region into peer memory) of len bytes, returning after its
 * completion.  A failed work request returns -EACCES for a remote access
 * error (bad key, range or rights at the peer), -EHOSTUNREACH when the
 * transport's retries ran out, -ECANCELED when the QP was already in error,
 * -EIO otherwise; the QP is in error after any of them.  -ETIMEDOUT means
 * no completion came within timeout_ms.
 */
#define RDMA_CM_RS_RDMA_READ 1
#define RDMA_CM_RS_RDMA_WRITE 2
struct rdma_cm_rs_rdma {
	__u32 id;
	__u32 opcode;			/* RDMA_CM_RS_RDMA_* */
	__u32 mr;
	__u32 offset;			/* in the region */
	__u32 len;			/* >= 1, offset + len <= the region's length */
	__u32 rkey;			/* the peer's remote key */
	__u64 remote_addr;		/* the peer's address */
	__u32 timeout_ms;		/* 0 = 5000 */
	__u32 reserved;
};

/*
 * Datagrams on UD ids (RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD).  CONNECT
 * creates the id's UD QP and performs the SIDR lookup (private data <= 180);
 * its ESTABLISHED event names the remote QP (ud_qp_num, ud_qkey) and a peer
 * handle.  ACCEPT on an id from a SIDR request creates the UD QP and
 * answers with its QP number and Q_Key (private data <= 136).  A peer is an
 * address handle plus the remote QP number and Q_Key, kept by the id until
 * it is destroyed; UD_RECV makes one for every new sender, so replies go
 * back to whoever sent.  Receives leave room for the 40-byte GRH, which
 * UD_RECV strips.
 */
#define RDMA_CM_RS_GRH_SIZE 40
#define RDMA_CM_RS_MAX_UD_PEERS 64		/* peers one UD id keeps */

#define RDMA_CM_RS_UD_WITH_IMM (1U << 0)	/* SEND_WITH_IMM / imm_data valid */

/* RDMA_CM_RS_IOC_UD_SEND: one datagram to a peer, returns after its completion. */
struct rdma_cm_rs_ud_send {
	__u32 id;
	__u32 peer;			/* a peer handle of the id */
	__u64 buf;			/* user pointer */
	__u32 len;			/* 1..max_datagram (QUERY) */
	__u32 flags;			/* RDMA_CM_RS_UD_WITH_IMM */
	__u32 imm_data;			/* with UD_WITH_IMM, host order (sent big-endian) */
	__u32 timeout_ms;		/* wait for the completion; 0 = 5000 */
};

/* RDMA_CM_RS_IOC_UD_RECV: the oldest datagram received on the id. */
struct rdma_cm_rs_ud_recv {
	__u32 id;
	__u32 len;			/* in: buffer size; out: datagram length (GRH excluded) */
	__u64 buf;			/* user pointer */
	__u32 timeout_ms;		/* 0 = do not wait; RDMA_CM_RS_TIMEOUT_INFINITE */
	__u32 flags;			/* out: RDMA_CM_RS_UD_WITH_IMM when imm_data is set */
	__u32 imm_data;			/* out: host order */
	__u32 peer;			/* out: the sender's peer handle; 0 when the table is full */
	__u32 src_qp;			/* out: the sender's QP number */
	__u32 reserved;
	struct rdma_cm_rs_sockaddr src;	/* out: the sender's address (port 0), from the GRH */
};

/*
 * Multicast on UD ids.  JOIN_MCAST joins a group (IPv4 224.0.0.0/4 or IPv6
 * ff00::/8) after BIND or RESOLVE_ADDR, making the id's UD QP if it has none;
 * MULTICAST_JOIN or MULTICAST_ERROR follows, carrying the join's context in
 * place of the id's.  MULTICAST_JOIN names the group as a peer: ud_peer (a
 * handle for UD_SEND), ud_qp_num 0xffffff, ud_qkey.  A full member's QP
 * receives the group's datagrams (UD_RECV, with their sender); a send-only
 * member's does not.  LEAVE_MCAST leaves: no datagram of the group reaches
 * the QP and no event of the join comes after it returned.  Destroying the
 * id leaves every group.  iWARP has no UD: -EPROTONOSUPPORT.
 */
#define RDMA_CM_RS_MAX_MCAST_GROUPS 56		/* groups one id joins */
#define RDMA_CM_RS_JOIN_SENDONLY (1U << 0)	/* a send-only full member */

/* RDMA_CM_RS_IOC_JOIN_MCAST */
struct rdma_cm_rs_join_mcast {
	__u64 context;			/* in: returned with the group's events */
	__u32 id;
	__u32 flags;			/* RDMA_CM_RS_JOIN_* */
	struct rdma_cm_rs_sockaddr addr;	/* the group */
	struct rdma_cm_rs_sync sync;	/* MULTICAST_JOIN or MULTICAST_ERROR */
};

/* RDMA_CM_RS_IOC_LEAVE_MCAST */
struct rdma_cm_rs_leave_mcast {
	__u32 id;
	__u32 reserved;
	struct rdma_cm_rs_sockaddr addr;	/* a group the id joined */
};

/*
 * RDMA_CM_RS_IOC_GETADDRINFO: rdma_getaddrinfo(3) as the module's kernel
 * callers have it: numeric hosts and services only (no resolver in the
 * kernel: a name fails with -EOPNOTSUPP).  In: the node and the service as
 * NUL-terminated text (empty: none) and the hints; out: the answer.
 */
#define RDMA_CM_RS_RAI_PASSIVE 0x1
#define RDMA_CM_RS_RAI_NUMERICHOST 0x2
#define RDMA_CM_RS_RAI_NOROUTE 0x4
#define RDMA_CM_RS_RAI_FAMILY 0x8
struct rdma_cm_rs_getaddrinfo {
	char node[64];			/* in */
	char service[16];		/* in */
	__u32 flags;			/* in: RDMA_CM_RS_RAI_*; out: the answer's */
	__u16 family;			/* in: 0 = any, AF_INET, AF_INET6; out */
	__u16 reserved;
	__u32 qp_type;			/* in: 0 = RC, RDMA_CM_RS_QPT_*; out */
	__u32 port_space;		/* in: 0 = the QP type's, RDMA_CM_RS_PS_*; out */
	struct rdma_cm_rs_sockaddr src;	/* out: the node of a passive answer, else family 0 */
	struct rdma_cm_rs_sockaddr dst;	/* out: the node of an active answer, else family 0 */
};

#define RDMA_CM_RS_IOCTL_MAGIC 0xD7

#define RDMA_CM_RS_IOC_INFO		_IOR(RDMA_CM_RS_IOCTL_MAGIC, 0x00, struct rdma_cm_rs_info)
#define RDMA_CM_RS_IOC_CREATE_ID	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x01, struct rdma_cm_rs_create_id)
#define RDMA_CM_RS_IOC_DESTROY_ID	_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x02, struct rdma_cm_rs_id_cmd)
#define RDMA_CM_RS_IOC_BIND		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x03, struct rdma_cm_rs_bind)
#define RDMA_CM_RS_IOC_RESOLVE_ADDR	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x04, struct rdma_cm_rs_resolve_addr)
#define RDMA_CM_RS_IOC_RESOLVE_ROUTE	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x05, struct rdma_cm_rs_resolve_route)
#define RDMA_CM_RS_IOC_LISTEN		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x06, struct rdma_cm_rs_listen)
#define RDMA_CM_RS_IOC_CONNECT		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x07, struct rdma_cm_rs_connect)
#define RDMA_CM_RS_IOC_ACCEPT		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x08, struct rdma_cm_rs_accept)
#define RDMA_CM_RS_IOC_REJECT		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x09, struct rdma_cm_rs_reject)
#define RDMA_CM_RS_IOC_DISCONNECT	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x0a, struct rdma_cm_rs_disconnect)
#define RDMA_CM_RS_IOC_SET_OPTION	_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x0b, struct rdma_cm_rs_set_option)
#define RDMA_CM_RS_IOC_QUERY		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x0c, struct rdma_cm_rs_query)
#define RDMA_CM_RS_IOC_GET_EVENT	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x0d, struct rdma_cm_rs_get_event)
#define RDMA_CM_RS_IOC_SEND		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x0e, struct rdma_cm_rs_send)
#define RDMA_CM_RS_IOC_RECV		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x0f, struct rdma_cm_rs_recv)
#define RDMA_CM_RS_IOC_MR_REG		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x10, struct rdma_cm_rs_mr_reg)
#define RDMA_CM_RS_IOC_MR_DEREG		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x11, struct rdma_cm_rs_mr_cmd)
#define RDMA_CM_RS_IOC_MR_WRITE		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x12, struct rdma_cm_rs_mr_copy)
#define RDMA_CM_RS_IOC_MR_READ		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x13, struct rdma_cm_rs_mr_copy)
#define RDMA_CM_RS_IOC_RDMA		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x14, struct rdma_cm_rs_rdma)
#define RDMA_CM_RS_IOC_UD_SEND		_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x15, struct rdma_cm_rs_ud_send)
#define RDMA_CM_RS_IOC_UD_RECV		_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x16, struct rdma_cm_rs_ud_recv)
#define RDMA_CM_RS_IOC_GET_REQUEST	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x17, struct rdma_cm_rs_get_request)
#define RDMA_CM_RS_IOC_GETADDRINFO	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x18, struct rdma_cm_rs_getaddrinfo)
#define RDMA_CM_RS_IOC_JOIN_MCAST	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x19, struct rdma_cm_rs_join_mcast)
#define RDMA_CM_RS_IOC_LEAVE_MCAST	_IOW(RDMA_CM_RS_IOCTL_MAGIC, 0x1a, struct rdma_cm_rs_leave_mcast)
#define RDMA_CM_RS_IOC_SEND_RECV	_IOWR(RDMA_CM_RS_IOCTL_MAGIC, 0x1b, struct rdma_cm_rs_send_recv)

#endif /* _UAPI_RDMA_CM_RS_H */
