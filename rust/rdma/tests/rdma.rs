// SPDX-License-Identifier: GPL-2.0

//! KUnit: RDMA READ/WRITE and what moves pages: the R/W API, page regions,
//! registrations chained before their advertisement, sends and receives
//! with attached pages.

use super::fixture::*;
use super::{take_out, wait_closely_until, wait_until, Checks};
use crate::rdma::{
    mr::{Mr, MrAccess, RemoteRegion, MAX_MR_LEN},
    net::NetNs,
    pd::Pd,
    sg::SgBuffer,
    verbs::{Cq, PollContext, Qp, QpCaps, RecvBuffer, RwOp, SendBuffer, Srq, SrqCaps},
    PostError,
};
use core::sync::atomic::Ordering;
use kernel::{
    prelude::*,
    sync::Arc,
    time::{delay::fsleep, Delta},
};

#[kunit_tests(rdma_cm_rs_rdma)]
mod rdma_tests {
    use super::*;

    /// The R/W API moves a buffer of pages (four of them, the last one
    /// partly) into the server's region with an RDMA WRITE and back with a
    /// READ, every byte checked, on rxe (plain requests) and on siw (where
    /// a READ registers its sink from the QP's pool and invalidates it).
    /// A region of another length is refused (`EINVAL`), the transfers in
    /// flight are bounded (`ENOSPC`: the slots on rxe, the pool's
    /// registrations on siw), and those still in flight at the teardown
    /// come back, each once.
    /// A buffer copies from another page to page, whatever the two
    /// offsets (the pieces end at either page's boundary), and zeroes a
    /// range across pages; the bytes around both stay, and a range past
    /// either end is refused (`EINVAL`).  `set_len` cuts a buffer and
    /// grows it back within its pages (its `capacity`), its bytes kept.
    #[test]
    fn sg_buffers_copy_and_zero_across_pages() {
        const LEN: usize = 3 * 4096 + 100;
        let pattern = |i: usize| (i * 7 + 3) as u8;
        let mut src = SgBuffer::new(LEN).unwrap();
        let mut bytes = KVec::with_capacity(LEN, GFP_KERNEL).unwrap();
        for i in 0..LEN {
            bytes.push(pattern(i), GFP_KERNEL).unwrap();
        }
        src.write(0, &bytes).unwrap();
        let mut dst = SgBuffer::new(LEN).unwrap();
        // Offsets 5 and 1000: the copy crosses the pages at different
        // places in each buffer.
        let (to, from, len) = (5, 1000, 2 * 4096 + 777);
        dst.copy_from(to, &src, from, len).unwrap();
        let mut out = KVec::from_elem(0u8, LEN, GFP_KERNEL).unwrap();
        dst.read(0, &mut out).unwrap();
        let copied = (0..LEN).all(|i| {
            let want = if (to..to + len).contains(&i) {
                pattern(i - to + from)
            } else {
                0
            };
            out[i] == want
        });
        src.zero(4000, 5000).unwrap();
        src.read(0, &mut out).unwrap();
        let zeroed = (0..LEN).all(|i| {
            out[i]
                == if (4000..9000).contains(&i) {
                    0
                } else {
                    pattern(i)
                }
        });
        // Cut to a page and back: the bytes stay, beyond the cut is refused,
        // and a length the pages cannot hold leaves the buffer as it was.
        let mut first = [0u8; 8];
        let resized = [
            dst.set_len(4096),
            dst.read(4090, &mut first[..7]),
            dst.set_len(4 * 4096 + 1),
            dst.set_len(0),
        ];
        let (cut_len, capacity) = (dst.len(), dst.capacity());
        let regrown = dst.set_len(LEN).and_then(|()| dst.read(to, &mut first));
        let kept = (0..8).all(|i| first[i] == pattern(from + i));
        let refused = [
            dst.copy_from(LEN - 10, &src, 0, 11),
            dst.copy_from(0, &src, LEN - 10, 11),
            dst.copy_from(0, &src, 0, 0),
            dst.zero(LEN, 1),
        ];
        assert!(copied);
        assert!(zeroed);
        assert_eq!(resized, [Ok(()), Err(EINVAL), Err(EINVAL), Err(EINVAL)]);
        assert_eq!(cut_len, 4096);
        assert_eq!(capacity, 4 * 4096);
        assert_eq!(regrown, Ok(()));
        assert!(kept);
        for r in refused {
            assert_eq!(r, Err(EINVAL));
        }
    }

    #[test]
    fn rw_api_moves_pages_both_ways() {
        rw_moves_pages(RXE_IP, 7199);
    }

    /// [`rw_api_moves_pages_both_ways`] on siw.
    #[test]
    fn rw_api_on_iwarp_registers_read_sinks() {
        rw_moves_pages(SIW_IP, 7200);
    }

    fn rw_moves_pages(ip: [u8; 4], port: u16) {
        let owner = owner();
        const PAGE: usize = kernel::page::PAGE_SIZE;
        const LEN: usize = 3 * PAGE + 100;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&owner, &ns, ip, port, PollContext::Direct, 4) else {
            return;
        };
        let poll_until = |done: &dyn Fn() -> bool| {
            wait_until(|| {
                let _ = pair.client_cq.poll(16);
                done()
            })
        };
        let (region, remote, registered) = pair.server_region(4 * PAGE + 200);
        let target = remote.slice(100, LEN as u32).unwrap();
        let mut pattern = KVec::new();
        for i in 0..LEN {
            pattern.push((i * 7 + 3) as u8, GFP_KERNEL).unwrap();
        }
        let mut out = SgBuffer::new(LEN).unwrap();
        out.write(0, &pattern).unwrap();

        let short = pair
            .client_qp
            .rdma_rw(RwOp::Write, SgBuffer::new(LEN - 1).unwrap(), target, 1);
        let short = short.err().map(|e| (e.error, e.value.len()));
        let written = pair.client_qp.rdma_rw(RwOp::Write, out, target, 2).is_ok();
        let write_done = poll_until(&|| pair.client_seen.rw_ok.load(Ordering::Acquire) == 1);
        let mut landed = KVec::new();
        landed.resize(LEN, 0u8, GFP_KERNEL).unwrap();
        region.read(100, &mut landed).unwrap();
        // The READ's sink is a buffer of five pages cut to LEN bytes
        // (`set_len`): exactly LEN bytes move.
        let mut sink = SgBuffer::new(5 * PAGE).unwrap();
        let cut = sink.set_len(LEN);
        let read = pair.client_qp.rdma_rw(RwOp::Read, sink, target, 3);
        let read = read.map_err(Error::from);
        let read_done = poll_until(&|| pair.client_seen.rw_ok.load(Ordering::Acquire) == 2);
        let read_digest = pair.client_seen.rw_digest.load(Ordering::Acquire);

        // A WRITE and a SEND in one post: the message arrives after the
        // bytes, and both buffers come back.  One opcode only for the SEND.
        let mut reversed = KVec::new();
        for b in pattern.iter().rev() {
            reversed.push(*b, GFP_KERNEL).unwrap();
        }
        let mut second = SgBuffer::new(LEN).unwrap();
        second.write(0, &reversed).unwrap();
        let mut both = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        both.fill(&[7; 16]).unwrap();
        both.set_imm(Some(1));
        both.set_invalidate(Some(2));
        let two_opcodes = pair
            .client_qp
            .rdma_rw_then_send(RwOp::Write, second, target, 4, both);
        let (two_opcodes, second, _both) = match two_opcodes {
            Err(PostError {
                error: e,
                value: (second, both),
            }) => (Some(e), second, both),
            Ok(()) => (None, SgBuffer::new(LEN).unwrap(), None),
        };
        let mut done = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        done.fill(&[7; 16]).unwrap();
        let signaled_before = pair.client_qp.signaled_rw_writes();
        let chained = pair
            .client_qp
            .rdma_rw_then_send(RwOp::Write, second, target, 5, done)
            .is_ok();
        let arrived = wait_until(|| pair.server_seen.received.load(Ordering::Acquire) == 1);
        let mut after_message = KVec::new();
        after_message.resize(LEN, 0u8, GFP_KERNEL).unwrap();
        region.read(100, &mut after_message).unwrap();
        let chain_back = poll_until(&|| {
            pair.client_seen.rw_ok.load(Ordering::Acquire) == 3
                && pair.client_seen.sends_back.load(Ordering::Acquire) == 1
        });
        // The chain's WRITE, unsignaled before its SEND, is signaled on
        // iWARP only (so that siw copies it).
        let signaled = pair.client_qp.signaled_rw_writes() - signaled_before;

        // Nobody polls: the transfers stay in flight until refused.
        let page = remote.slice(0, PAGE as u32).unwrap();
        let (mut in_flight, mut refused) = (0u32, None);
        for tag in 10..30 {
            match pair
                .client_qp
                .rdma_rw(RwOp::Read, SgBuffer::new(PAGE).unwrap(), page, tag)
            {
                Ok(()) => in_flight += 1,
                Err(PostError { error: e, .. }) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        drop(pair._client);
        let back = pair.client_seen.rw_back.load(Ordering::Acquire);
        // The rest of the pair goes at the end.
        drop(region);

        assert!(registered);
        assert_eq!(short, Some((EINVAL, LEN - 1)));
        assert!(written && write_done);
        assert!(landed == pattern);
        assert_eq!(cut, Ok(()));
        assert_eq!(read, Ok(()));
        assert!(read_done);
        assert_eq!(read_digest, digest(&pattern));
        assert!(in_flight >= 1);
        assert_eq!(refused, Some(ENOSPC));
        assert_eq!(two_opcodes, Some(EINVAL));
        assert!(chained && arrived && chain_back);
        assert_eq!(signaled, u64::from(ip == SIW_IP));
        assert!(after_message == reversed);
        assert_eq!(back, 3 + in_flight);
    }

    /// A region over pages (2 MiB less 100 bytes on rxe, twice the
    /// contiguous limit; 1 MiB on siw, its fast registration's limit), one
    /// page more refused: the peer writes 64 KiB at its start, across its
    /// middle at an odd offset and at its end, and reads them back; the
    /// server's own RDMA WRITE from an odd offset of it (its local bytes
    /// named through the registration's addresses, across pages) lands in
    /// the client's region; every byte checked.
    #[test]
    fn page_region_beyond_the_contiguous_limit() {
        page_region_moves_bytes(RXE_IP, 7202);
    }

    /// A registration chained before the SEND that advertises it
    /// (`prepare_registration`, then `register_then_send`): one post; the
    /// registration has no completion of its own, yet is reported done
    /// before the SEND comes back, and the peer reads the region through
    /// the key it got at once.  While prepared, the region refuses another
    /// registration; prepared and dropped, it is free again; a SEND of
    /// another PD hands both back.  With the SEND unsignaled, nothing comes
    /// back until the next signaled request, which gives back both first.
    #[test]
    fn registration_chained_before_its_advertisement() {
        chained_registration(RXE_IP, 7206);
    }

    /// [`registration_chained_before_its_advertisement`] on siw.
    #[test]
    fn registration_chained_on_iwarp() {
        chained_registration(SIW_IP, 7207);
    }

    /// Sends gather the buffer's bytes and attached pages, receives
    /// scatter into the buffer and then its pages (rxe).
    #[test]
    fn pages_gathered_and_scattered() {
        gather_and_scatter(RXE_IP, 7209, false);
    }

    /// [`pages_gathered_and_scattered`] on siw.
    #[test]
    fn pages_gathered_and_scattered_on_iwarp() {
        gather_and_scatter(SIW_IP, 7210, true);
    }

    /// Posts a SEND of `head` from a buffer of `qp`'s PD and of `paged`
    /// from pages attached to it, unsignaled or not.
    fn post_with_pages(qp: &Qp<Recording>, head: &[u8], paged: &[u8], unsignaled: bool) -> Result {
        let mut send = SendBuffer::new(qp.pd(), head.len().max(1))?;
        send.fill(head)?;
        let mut pages = SgBuffer::new(paged.len())?;
        pages.write(0, paged)?;
        send.attach_pages(pages);
        send.set_unsignaled(unsignaled);
        qp.post_send(send).map_err(Error::from)
    }

    /// `len` bytes of a pattern that differs from offset to offset and
    /// from `seed` to `seed`.
    fn pattern(len: usize, seed: u8) -> KVec<u8> {
        let mut bytes = KVec::new();
        for i in 0..len {
            let _ = bytes.push((i * 7) as u8 ^ (i >> 8) as u8 ^ seed, GFP_KERNEL);
        }
        bytes
    }

    /// The client sends a 16-byte header from its buffer and 2 pages and
    /// 100 bytes from attached pages into the server's receive of 16 bytes
    /// and 3 pages; the server answers with attached pages alone (40
    /// bytes, no bytes of the buffer's own) into the client's plain
    /// receive.  Every byte arrives in order, and each buffer comes back
    /// with its pages.  Refused before the post, the pages still attached:
    /// more entries than the QP's `max_send_sge` (the server's is 1)
    /// (`EMSGSIZE`), pages on an inline send (`EINVAL`), a receive with
    /// pages on an SRQ (`EMSGSIZE`).  A second send with pages, unsignaled,
    /// comes back by itself on iWARP (signaled by the layer: siw would send
    /// it straight from the pages), and not before a later completion on
    /// RoCE.
    fn gather_and_scatter(ip: [u8; 4], port: u16, iwarp: bool) {
        let owner = owner();
        const HEAD: usize = 16;
        const PAGED: usize = 2 * 4096 + 100;
        const ANSWER: usize = 40;
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&owner, &ns, ip, port) else {
            return;
        };
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let s_seen = server_seen.clone();
        let server_caps = QpCaps {
            max_send_sge: 1,
            ..RECORDING_CAPS
        };
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            recording_qp_with(server, &s_seen, PollContext::Workqueue, server_caps, 0)
                .map(|(qp, _)| qp)
        });
        let (client, (client_qp, client_cq), client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let s_pd = server_qp.pd().clone();
        let header = pattern(HEAD, 1);
        let paged = pattern(PAGED, 2);
        let answer = pattern(ANSWER, 3);

        // The server's receive: 16 bytes, then 3 pages.
        let mut recv = RecvBuffer::new(&s_pd, HEAD).unwrap();
        let none_before = recv
            .attach_pages(SgBuffer::new(3 * 4096).unwrap())
            .is_none();
        let recv_posted = server_qp.post_recv(recv).is_ok();
        // The client's send: the header, then 2 pages and 100 bytes.
        let sent = post_with_pages(&client_qp, &header, &paged, false).is_ok();
        let (arrived, s_len, s_digest) = server_seen.arrival(1);
        let send_back = wait_until(|| client_seen.send_pages_back.load(Ordering::Acquire) == 1);

        // The same again, unsignaled.
        let mut recv = RecvBuffer::new(&s_pd, HEAD).unwrap();
        recv.attach_pages(SgBuffer::new(3 * 4096).unwrap());
        let second_recv_posted = server_qp.post_recv(recv).is_ok();
        let second_sent = post_with_pages(&client_qp, &header, &paged, true).is_ok();
        let second_arrived = wait_until(|| server_seen.received.load(Ordering::Acquire) == 2);
        let second_digest = server_seen.last_digest.load(Ordering::Acquire);
        // Time for a completion to arrive, if one comes.
        fsleep(Delta::from_millis(50));
        let unsignaled_back = client_seen.send_pages_back.load(Ordering::Acquire);

        // Refusals on the server's QP: a header and pages are two entries,
        // over its one.
        let mut too_many = SendBuffer::new(&s_pd, 8).unwrap();
        too_many.fill(b"header").unwrap();
        too_many.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let over_sge = server_qp.post_send(too_many).err();
        let over_sge = over_sge.map(|e| (e.error, e.value.pages().is_some()));
        let mut inline = SendBuffer::new(&s_pd, 8).unwrap();
        inline.set_inline(true);
        inline.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let inline = server_qp.post_send(inline).err();
        let inline = inline.map(|e| (e.error, e.value.pages().is_some()));
        let srq = Srq::<Recording>::new(&s_pd, 4).unwrap();
        let mut on_srq = RecvBuffer::new(&s_pd, 8).unwrap();
        on_srq.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let on_srq = srq.post_recv(on_srq).err();
        let on_srq = on_srq.map(|e| (e.error, e.value.pages().is_some()));
        drop(srq);

        // The answer: pages alone, one entry.
        let answered = post_with_pages(&server_qp, &[], &answer, false).is_ok();
        let (answer_arrived, c_len, c_digest) = client_seen.arrival(1);
        let answer_back = wait_until(|| server_seen.send_pages_back.load(Ordering::Acquire) == 1);
        let recv_back = server_seen.recv_pages_back.load(Ordering::Acquire);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((
            client_qp, client_cq, client, server_qp, s_pd, server, listener,
        ));
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        assert!(none_before);

        assert!(recv_posted && sent && arrived && send_back);
        assert_eq!(s_len as usize, HEAD + PAGED);
        assert_eq!(s_digest, digest_on(digest(&header), &paged));
        assert!(second_recv_posted && second_sent && second_arrived);
        assert_eq!(second_digest, s_digest);
        assert_eq!(unsignaled_back, if iwarp { 2 } else { 1 });
        assert_eq!(recv_back, 2);
        assert_eq!(over_sge, Some((EMSGSIZE, true)));
        assert_eq!(inline, Some((EINVAL, true)));
        assert_eq!(on_srq, Some((EMSGSIZE, true)));
        assert!(answered && answer_arrived && answer_back);
        assert_eq!(c_len as usize, ANSWER);
        assert_eq!(c_digest, digest(&answer));
    }

    /// An SRQ made for 4 scatter entries ([`SrqCaps::max_sge`]): the
    /// client's 16-byte header, 2 pages and 100 bytes arrive in the
    /// server's SRQ receive of 16 bytes and 3 pages, every byte in order,
    /// and the receive comes back with its pages.  An SRQ of more entries
    /// than the device's `max_srq_sge` is refused (`EINVAL`).
    #[test]
    fn srq_receives_scatter_into_pages() {
        let owner = owner();
        const HEAD: usize = 16;
        const PAGED: usize = 2 * 4096 + 100;
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&owner, &ns, RXE_IP, 7211) else {
            return;
        };
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let pd = Pd::alloc(&owner, &dev).unwrap();
        let beyond_device = SrqCaps {
            max_wr: 4,
            max_sge: dev.caps().max_srq_sge + 1,
        };
        let too_wide = Srq::<Recording>::with_caps(&pd, beyond_device, None).err();
        let srq_caps = SrqCaps {
            max_wr: 4,
            max_sge: 4,
        };
        let srq = Srq::<Recording>::with_caps(&pd, srq_caps, None).unwrap();
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let caps = on_srq_caps();
        let entries = srq_caps.max_wr + caps.send_cq_entries().unwrap();
        let cq = Cq::alloc(&owner, &dev, entries, Recording(server_seen.clone())).unwrap();
        let mut recv = RecvBuffer::new(&pd, HEAD).unwrap();
        let pages = SgBuffer::new(3 * 4096).unwrap();
        let page_entries = pages.entries();
        recv.attach_pages(pages);
        let posted = srq.post_recv(recv).err().map(Error::from);

        let (s_pd, s_cq, s_srq) = (pd.clone(), cq.clone(), srq.clone());
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            server.with_lock(|l| l.create_qp_on_srq(&s_pd, &s_cq, &s_cq, &s_srq, caps))
        });
        let (client, (client_qp, client_cq), _client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                drop((srq, cq, pd, dev));
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let header = pattern(HEAD, 4);
        let paged = pattern(PAGED, 5);
        let sent = post_with_pages(&client_qp, &header, &paged, false).is_ok();
        let (arrived, len, digest_seen) = server_seen.arrival(1);
        let recv_back = wait_until(|| server_seen.recv_pages_back.load(Ordering::Acquire) == 1);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((
            client_qp, client_cq, client, server_qp, server, srq, cq, pd, dev,
        ));
        drop(listener);
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        assert_eq!(too_wide, Some(EINVAL));
        // 3 pages are 1 to 3 entries (adjacent pages merge): with the
        // buffer's, within the SRQ's 4.
        assert!((1..=3).contains(&page_entries));
        assert_eq!(posted, None);
        assert!(sent && arrived && recv_back);
        assert_eq!(len as usize, HEAD + PAGED);
        assert_eq!(digest_seen, digest_on(digest(&header), &paged));
    }

    fn chained_registration(ip: [u8; 4], port: u16) {
        let case = owner();
        const LEN: usize = 8192;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&case, &ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        // The client registers and advertises: on iWARP the passive side
        // may not send before the active side's first message.
        let (owner, reader) = (&pair.client_qp, &pair.server_qp);
        let (owned, read_by) = (pair.client_seen.clone(), pair.server_seen.clone());
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let mut pattern = KVec::new();
        for i in 0..LEN {
            pattern.push((i * 13 + 5) as u8, GFP_KERNEL).unwrap();
        }
        let region = Mr::new(owner.pd(), LEN).unwrap();
        region.write(0, &pattern).unwrap();

        let dropped = owner.prepare_registration(&region, access).is_ok();
        let prepared = owner.prepare_registration(&region, access).unwrap();
        let while_prepared = owner.register(&region, access, 1).err();
        let prepared_twice = owner.prepare_registration(&region, access).err();
        let registered_early = region.is_registered();
        let remote = prepared.region();
        // On iWARP the passive side may not send before the active side's
        // first message: refused, both back.
        let passive_first = (ip == SIW_IP).then(|| {
            let early = Mr::new(reader.pd(), 4096).unwrap();
            let prepared = reader.prepare_registration(&early, access).unwrap();
            let send = SendBuffer::new(reader.pd(), 16).unwrap();
            reader
                .register_then_send(prepared, 6, send)
                .err()
                .map(Error::from)
        });

        let other_pd = Pd::alloc(&case, owner.device()).unwrap();
        let foreign = SendBuffer::new(&other_pd, 16).unwrap();
        let refused = owner.register_then_send(prepared, 2, foreign);
        let both_back = matches!(
            refused,
            Err(PostError {
                value: (Some(_), _),
                ..
            })
        );
        let Err(PostError {
            error: refused,
            value: (Some(prepared), foreign),
        }) = refused
        else {
            // An assertion ends the test without unwinding: what holds the
            // device goes first.
            drop((region, other_pd));
            drop(pair);
            assert!(both_back);
            return;
        };
        let mut advert = SendBuffer::new(owner.pd(), 16).unwrap();
        advert.fill(&advertisement(remote)).unwrap();
        let posted = owner
            .register_then_send(prepared, 3, advert)
            .map_err(Error::from);
        let registered = region.is_registered();
        let arrived = wait_until(|| read_by.received.load(Ordering::Acquire) == 1);
        let advert_digest = read_by.last_digest.load(Ordering::Acquire);
        // The peer acts on the message at once.
        let read = reader
            .rdma_rw(RwOp::Read, SgBuffer::new(LEN).unwrap(), remote, 4)
            .map_err(Error::from);
        let read_back = wait_until(|| read_by.rw_back.load(Ordering::Acquire) == 1);
        let read_ok = read_by.rw_ok.load(Ordering::Acquire);
        let read_digest = read_by.rw_digest.load(Ordering::Acquire);
        let advert_back = wait_until(|| owned.sends_back.load(Ordering::Acquire) == 1);
        let work_at_advert = owned.work_ok_at_send.load(Ordering::Acquire);

        // Unsignaled: both wait for the next signaled request.
        let second = Mr::new(owner.pd(), 4096).unwrap();
        let prepared = owner.prepare_registration(&second, access).unwrap();
        let mut quiet = SendBuffer::new(owner.pd(), 16).unwrap();
        quiet.fill(&advertisement(prepared.region())).unwrap();
        quiet.set_unsignaled(true);
        let quiet_posted = owner.register_then_send(prepared, 5, quiet).is_ok();
        let quiet_arrived = wait_until(|| read_by.received.load(Ordering::Acquire) == 2);
        // Time for completions that should not come.
        fsleep(Delta::from_millis(200));
        let while_idle = (
            owned.work_ok.load(Ordering::Acquire),
            owned.sends_back.load(Ordering::Acquire),
        );
        let loud = post_marked(owner, 9, false);
        let all_back = wait_until(|| owned.sends_back.load(Ordering::Acquire) == 3);
        let work_at_quiet = owned.work_ok.load(Ordering::Acquire);
        // Everything of the device goes before the first assertion, which
        // ends the test without unwinding: a PD left would hold the device.
        drop((region, second, foreign, other_pd));
        drop(pair);
        assert!(dropped);
        assert_eq!(while_prepared, Some(EBUSY));
        assert_eq!(prepared_twice, Some(EBUSY));
        assert!(!registered_early);
        if let Some(refused) = passive_first {
            assert_eq!(refused, Some(EAGAIN));
        }
        assert_eq!(refused, EINVAL);
        assert_eq!(posted, Ok(remote));
        assert!(registered);
        assert!(arrived);
        assert_eq!(advert_digest, digest(&advertisement(remote)));
        assert_eq!(read, Ok(()));
        assert!(read_back);
        assert_eq!(read_ok, 1);
        assert_eq!(read_digest, digest(&pattern));
        assert!(advert_back);
        assert_eq!(work_at_advert, 1);
        assert!(quiet_posted && quiet_arrived && loud);
        assert_eq!(while_idle, (1, 1));
        assert!(all_back);
        assert_eq!(work_at_quiet, 2);
        assert_eq!(owned.sends_failed.load(Ordering::Acquire), 0);
    }

    /// [`page_region_beyond_the_contiguous_limit`] on siw.
    #[test]
    fn page_region_on_iwarp() {
        page_region_moves_bytes(SIW_IP, 7203);
    }

    /// A region dropped while its peer still WRITEs into it, on siw: the
    /// memory is freed only once no placement of the driver can still
    /// reach it.  siw places a WRITE chunk by chunk, each after checking
    /// the key, in its socket's receive callback, and its `ib_dereg_mr`
    /// does not wait for a chunk under way: freed right after the
    /// deregistration, the region is written after its free.  Each round
    /// drops the region once the first WRITE's placement passed a point
    /// that moves with the round; the later WRITEs fail.  The window (siw's
    /// check to its copy) is a few instructions: with
    /// `tools/debug/siw-dereg-window.patch`, which widens it to 200 us,
    /// KASAN reported the write to freed memory in the first run without
    /// the grace period.
    #[test]
    fn region_dropped_under_a_peers_write_is_freed_after_it() {
        let owner = owner();
        const ROUNDS: u16 = 16;
        const WRITES: u32 = 3;
        const PATTERN: u8 = 0xa5;
        let ns = NetNs::init();
        let access = MrAccess {
            remote_read: false,
            remote_write: true,
        };
        let mut checks = Checks::new();
        let mut writes_failed = 0;
        for round in 0..ROUNDS {
            let Some(pair) =
                recording_pair(&owner, &ns, SIW_IP, 7221 + round, PollContext::Workqueue, 0)
            else {
                // Without siw0 the case is skipped (the first round);
                // later, a round that could not connect failed.
                if round == 0 {
                    return;
                }
                checks.eq("rounds that could connect", round, ROUNDS);
                break;
            };
            let local = Mr::new(pair.client_qp.pd(), MAX_MR_LEN).unwrap();
            let mut bytes = KVec::new();
            bytes.resize(MAX_MR_LEN, PATTERN, GFP_KERNEL).unwrap();
            local.write(0, &bytes).unwrap();
            let region = Mr::new(pair.server_qp.pd(), MAX_MR_LEN).unwrap();
            let ready = pair.client_qp.register(&local, MrAccess::LOCAL, 1).is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == 1);
            let remote = pair.server_qp.register(&region, access, 1).ok();
            let ready = ready
                && remote.is_some()
                && wait_until(|| pair.server_seen.work_ok.load(Ordering::Acquire) == 1);
            let posted = match (ready, remote) {
                (true, Some(remote)) => (0..WRITES)
                    .take_while(|w| {
                        pair.client_qp
                            .rdma(RwOp::Write, &local, 0, remote, 2 + u64::from(*w))
                            .is_ok()
                    })
                    .count() as u32,
                _ => 0,
            };
            // Dropped while the placement is under way: as soon as the
            // first WRITE reached a point that moves with the round.
            let at = (usize::from(round) + 1) * (MAX_MR_LEN / usize::from(ROUNDS + 1));
            let mut byte = [0u8];
            let reached = posted > 0
                && wait_closely_until(Delta::from_secs(5), || {
                    region.read(at, &mut byte).is_ok() && byte[0] == PATTERN
                });
            drop(region);
            // The WRITEs left come back before the pair goes (failed, or
            // flushed once the peer's QP terminated the connection).
            let seen = &pair.client_seen;
            let back = wait_until(|| seen.work_back.load(Ordering::Acquire) > posted);
            writes_failed +=
                seen.work_back.load(Ordering::Acquire) - seen.work_ok.load(Ordering::Acquire);
            // Each with its round, to tell which failed.
            checks.eq("registered, in round", (round, ready), (round, true));
            checks.eq("WRITEs posted, in round", (round, posted), (round, WRITES));
            checks.eq(
                "the first WRITE reached the drop's offset, in round",
                (round, at, reached),
                (round, at, true),
            );
            checks.eq(
                "requests back (the registration and the WRITEs), in round",
                (round, back, seen.work_back.load(Ordering::Acquire)),
                (round, true, posted + 1),
            );
            drop((local, pair));
        }
        // The WRITEs after the drop failed (the peer's QP saw the key
        // invalid and terminated the connection).
        checks.check("a WRITE after a drop failed", writes_failed > 0);
        assert_eq!(checks.failures(), 0);
    }

    fn page_region_moves_bytes(ip: [u8; 4], port: u16) {
        let owner = owner();
        const PAGE: usize = kernel::page::PAGE_SIZE;
        const CHUNK: usize = 64 * 1024;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&owner, &ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        let pages = (pair.server_qp.device().max_fast_reg_page_list_len() as usize).min(512);
        let len = pages * PAGE - 100;
        let too_many =
            Mr::from_pages(pair.server_qp.pd(), SgBuffer::new(len + PAGE).unwrap()).err();
        let region = Mr::from_pages(pair.server_qp.pd(), SgBuffer::new(len).unwrap()).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let remote = pair.server_qp.register(&region, access, 1).unwrap();
        let local = Mr::new(pair.client_qp.pd(), CHUNK).unwrap();
        let client_remote = pair.client_qp.register(&local, access, 2).unwrap();
        let registered = wait_until(|| {
            pair.server_seen.work_ok.load(Ordering::Acquire) == 1
                && pair.client_seen.work_ok.load(Ordering::Acquire) == 1
        });

        let mut pattern = KVec::new();
        let mut back = KVec::new();
        let mut mismatches = 0u32;
        // The client's registration succeeded: one.
        let mut done = 1;
        for (round, at) in [0, len / 2 + 3001, len - CHUNK].into_iter().enumerate() {
            pattern.clear();
            for i in 0..CHUNK {
                pattern
                    .push((i * 13 + round * 7 + 1) as u8, GFP_KERNEL)
                    .unwrap();
            }
            local.write(0, &pattern).unwrap();
            let span = remote.slice(at as u64, CHUNK as u32).unwrap();
            let wrote = pair.client_qp.rdma(RwOp::Write, &local, 0, span, 10);
            done += 1;
            let written = wrote.is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == done);
            back.clear();
            back.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
            region.read(at, &mut back).unwrap();
            // Read back by the peer too, over a zeroed local copy.
            local.write(0, &[0; 4096]).unwrap();
            let read = pair.client_qp.rdma(RwOp::Read, &local, 0, span, 11);
            done += 1;
            let read = read.is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == done);
            let mut peer_view = KVec::new();
            peer_view.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
            local.read(0, &mut peer_view).unwrap();
            if !(written && read && back == pattern && peer_view == pattern) {
                mismatches += 1;
            }
        }

        // The server's WRITE from its page region, at an odd offset: on
        // iWARP once the client's first message came.
        let spoke = post_marked(&pair.client_qp, 1, false)
            && wait_until(|| pair.server_seen.received.load(Ordering::Acquire) == 1);
        let from = PAGE + 77;
        pattern.clear();
        for i in 0..CHUNK {
            pattern.push((i * 5 + 9) as u8, GFP_KERNEL).unwrap();
        }
        region.write(from, &pattern).unwrap();
        let pushed = pair
            .server_qp
            .rdma(RwOp::Write, &region, from, client_remote, 12);
        let pushed =
            pushed.is_ok() && wait_until(|| pair.server_seen.work_ok.load(Ordering::Acquire) == 2);
        let mut landed = KVec::new();
        landed.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
        local.read(0, &mut landed).unwrap();
        drop((local, pair));
        let region_len = region.len();
        drop(region);

        assert_eq!(too_many, Some(EINVAL));
        assert_eq!(region_len, len);
        assert!(registered);
        assert_eq!(mismatches, 0);
        assert!(spoke && pushed);
        assert!(landed == pattern);
    }

    /// READs whose QP goes to the error state while siw's transmitter
    /// works through them: as many as the QP takes, then at once a
    /// disconnect, sixteen rounds on siw (each a connection of its own) and
    /// one on rxe.  Each transfer comes back once.  siw completes a READ
    /// its transmitter had taken up but not yet sent twice, from the ORQ
    /// the READ was copied to and as the send queue's current request (see
    /// `Documentation/rdma_cm_rs/design.rst`, "Driver behaviour"): the
    /// layer takes the first completion only.
    #[test]
    fn read_flushed_before_it_was_sent_comes_back_once() {
        for round in 0..16 {
            read_flushed_before_it_was_sent(SIW_IP, 7230 + round);
        }
        read_flushed_before_it_was_sent(RXE_IP, 7246);
    }

    fn read_flushed_before_it_was_sent(ip: [u8; 4], port: u16) {
        const LEN: usize = 4096;
        let owner = owner();
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&owner, &ns, ip, port, PollContext::Workqueue, 1) else {
            return;
        };
        let (region, remote, registered) = pair.server_region(LEN);
        let source = remote.slice(0, LEN as u32).unwrap();
        let mut posted = 0u32;
        let mut refused = None;
        for tag in 0..32 {
            let sink = SgBuffer::new(LEN).unwrap();
            match pair.client_qp.rdma_rw(RwOp::Read, sink, source, tag) {
                Ok(()) => posted += 1,
                Err(PostError { error: e, .. }) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        // With one READ at a time on the wire, siw's receiver takes the
        // next one up as the first one's response completes it: the
        // disconnect comes then.
        let first_back = wait_closely_until(ms(5000), || {
            pair.client_seen.rw_back.load(Ordering::Acquire) >= 1
        });
        let disconnected = pair._client.disconnect();
        drop(pair._client);
        let back = pair.client_seen.rw_back.load(Ordering::Acquire);
        drop(region);
        assert!(registered);
        assert!(first_back);
        assert_eq!(disconnected, Ok(()));
        assert!(posted >= 2);
        assert_eq!(refused, Some(ENOSPC));
        assert_eq!(back, posted);
    }

    /// An R/W READ refused by the peer (a key it never gave): on rxe the
    /// buffer comes back with the error at once; on siw (iWARP) the READ
    /// request handed the peer a key to write into the sink, which only a
    /// successful READ revokes, so the buffer comes back only once the QP
    /// is destroyed (before, a peer could write into pages the consumer
    /// had back).
    #[test]
    fn failed_read_returns_its_sink_when_no_peer_can_write_it() {
        failed_read_hand_back(RXE_IP, 7204);
        failed_read_hand_back(SIW_IP, 7205);
    }

    fn failed_read_hand_back(ip: [u8; 4], port: u16) {
        let owner = owner();
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&owner, &ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        let nowhere = RemoteRegion {
            addr: 0x1000,
            rkey: 0x5eed_0001,
            len: 4096,
        };
        let read = pair
            .client_qp
            .rdma_rw(RwOp::Read, SgBuffer::new(4096).unwrap(), nowhere, 1);
        let read = read.map_err(Error::from);
        let iwarp = ip == SIW_IP;
        let back_at_once = if iwarp {
            // Time for the peer's refusal to come back, which must not
            // hand the buffer over.
            fsleep(ms(500));
            pair.client_seen.rw_back.load(Ordering::Acquire) == 1
        } else {
            wait_until(|| pair.client_seen.rw_back.load(Ordering::Acquire) == 1)
        };
        let before_teardown = pair.client_seen.rw_back.load(Ordering::Acquire);
        drop(pair._client);
        let after_teardown = pair.client_seen.rw_back.load(Ordering::Acquire);
        let succeeded = pair.client_seen.rw_ok.load(Ordering::Acquire);
        assert_eq!(read, Ok(()));
        assert_eq!(back_at_once, !iwarp);
        assert_eq!(before_teardown, u32::from(!iwarp));
        assert_eq!(after_teardown, 1);
        assert_eq!(succeeded, 0);
    }
}
