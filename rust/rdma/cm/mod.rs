// SPDX-License-Identifier: GPL-2.0

//! Communication identifiers (`struct rdma_cm_id`).
//!
//! C header: [`include/rdma/rdma_cm.h`](srctree/include/rdma/rdma_cm.h).
//!
//! # Ownership and locking
//!
//! * A [`CmId`] owns one `rdma_cm_id`.  Dropping it destroys the id: after
//!   the drop returns no callback runs any more.  There is no other way to
//!   destroy an id, so double destroy and use after destroy do not compile.
//! * Every call into the CM on an id but `rdma_listen` and `rdma_disconnect`
//!   runs with the id's `handler_mutex` held: inside the id's callback the
//!   CM holds it, and [`CmId::with_lock`] takes it (`rdma_lock_handler`)
//!   outside.  [`CmId::listen`] runs without it, as ucma calls it: on a
//!   wildcard listener's error path `rdma_listen` destroys the internal
//!   per-device listeners it made, taking their handler mutexes (one lock
//!   class with the id's).  [`CmId::disconnect`] too: on iWARP it waits for
//!   a pending connect's reply, which needs the mutex.  Outside callbacks,
//!   every call on an id, these included, is serialised by a mutex of the
//!   layer's own (`calls`).  The two calls without the handler mutex also
//!   hold a second one (`unlocked_call`), which the CM calls of the id's
//!   callbacks only try: while a disconnect or listen runs they fail with
//!   `EBUSY` (waiting could be for themselves), and while they run the
//!   disconnect waits (a connect that fails frees the CM's IB or iWARP id
//!   that `rdma_disconnect` uses).  So every CM call on an id is ordered
//!   against every other, whoever makes it.  Both hand out a [`LockedId`],
//!   the only type with CM operations on it.  This serialises the id's
//!   operations with each other and with its events ("the rdma_cm must be
//!   used single threaded", ucma.c), makes `rdma_accept`'s lockdep
//!   assertion hold by construction, and lets [`LockedId::connect`] use
//!   `rdma_connect_locked` everywhere.
//! * The handler gets `&LockedId`, never the owner: it cannot destroy its
//!   own id.  If a consumer drops a [`CmId`] from inside any of the layer's
//!   callbacks (the id's own: the deadlock `rdma_destroy_id` documents;
//!   another id's: two handler mutexes of one lock class; a completion: a
//!   QP drain behind the running completion), the destruction is deferred
//!   to its owner's queue ([`ModuleOwner`](super::ModuleOwner)).  For the same
//!   reasons [`CmId::with_lock`] refuses (`EDEADLK`) to take an id's mutex inside
//!   another callback of the layer; inside the id's own callback it runs
//!   without taking the mutex the CM already holds.
//! * A connection request hands the listener's handler a [`ConnectRequest`]
//!   that owns the new id (the only id whose mutex the CM is known to hold:
//!   for a wildcard listener the CM holds one of its internal per-device
//!   listeners' mutexes, not the listener's).  [`ConnectRequest::adopt`]
//!   turns it into a [`CmId`] with its own handler; a request that is
//!   dropped unadopted makes the callback return non-zero, so the CM
//!   destroys the new id (take-once ownership: the id is destroyed by
//!   exactly one party).
//! * The id owns its QP ([`LockedId::create_qp`]: reliable connected on
//!   TCP ids, unreliable datagram on UDP ids, the latter made by the layer,
//!   not the CM, so that the id can join multicast groups).  Destruction first marks the
//!   id dying under its handler mutex, which waits for a running callback
//!   and makes every later `create_qp` fail, then shuts down (flushes) and
//!   destroys the QP without the mutex, then destroys the id.
//! * A UD id's multicast groups ([`LockedId::join_multicast`]) are left by
//!   [`CmId::leave_multicast`], which runs without the handler mutex (the
//!   CM waits there for the join's event, which takes it), or by the id's
//!   destruction; the id's QP is attached to a group when its join event
//!   comes and detached when it is left or the QP is shut down.
//! * DEVICE_REMOVAL: the CM waits for every id on the device to be destroyed
//!   before the device goes.  Consumers drop their ids on that event (from
//!   the handler, which defers the destruction).

mod groups;
mod id;
mod locked;
mod multicast;
mod port_space;
mod qp_slot;
mod ud_qp;

pub use self::{
    groups::{JoinState, MAX_GROUPS},
    id::{CmId, ConnectRequest, Handler},
    locked::{LockedId, MAX_RESOLVE_TIMEOUT},
    port_space::PortSpace,
};
