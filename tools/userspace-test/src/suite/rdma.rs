// SPDX-License-Identifier: GPL-2.0

//! RDMA READ and WRITE between the module and a librdmacm peer, and the
//! errors of bad keys and requests.

#[allow(unused_imports)]
use super::*;

pub(super) const SEED_MODULE_WRITES: u8 = 0x61;
pub(super) const SEED_MODULE_REGION: u8 = 0x62;
pub(super) const REMOTE_RW: u32 = RDMA_CM_RS_ACCESS_REMOTE_READ | RDMA_CM_RS_ACCESS_REMOTE_WRITE;
/// IBV_WC_REM_ACCESS_ERR.
pub(super) const WC_REM_ACCESS_ERR: u32 = 10;

/// Starts the agent's RDMA peer (`rdma=LEN rdmamode=MODE`), connects the
/// module to it (both RDMA read depths 1: the module reads, and serves the
/// peer's reads) and returns the call, the id and the peer's advertisement.
pub(super) fn connect_rdma_peer(
    ctx: &mut Ctx,
    dev: &Device,
    len: usize,
    mode: &str,
) -> Result<(Call, u32, (u64, u32, u32))> {
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    // Over iWARP the active side sends first (`rdma_connect(3)`): the
    // module's message, then the peer's advertisement.  A peer that sent
    // first made the module's connect fail now and then under load
    // (CONNECT_ERROR, -EINVAL: siw's active side found the SEND behind the
    // MPA reply it was still reading).
    let first = if ctx.iwarp() { " first=recv" } else { "" };
    let mut call = Call::start(
        &ctx.agent,
        &format!("serve addr={addr} count=1 accept=- rdma={len} rdmamode={mode}{first}"),
    )?;
    call.ready()?;
    let id = resolve(dev, addr)?;
    dev.connect(id, &Param::with_data(b"rdma"))?;
    wait(dev, EventType::Established)?;
    if ctx.iwarp() {
        dev.send(id, b"first")
            .context("the active side's first message")?;
    }
    let advert = parse_advert(&dev.recv(id, 4096, T)?)?;
    Ok((call, id, advert))
}

/// RDMA READ and WRITE in both directions between a module region and a
/// librdmacm region, across page boundaries (64 KiB + 3 bytes, offsets not
/// aligned), and a peer's write with the key of a deregistered region.
pub(super) fn rdma_read_write(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let n = 65536 + 3;
    let (call, id, (paddr, pkey, plen)) = connect_rdma_peer(ctx, &dev, n, "full disc=self")?;
    ensure!(plen as usize == n, "peer advertised {plen} bytes");
    let (mr, maddr, mkey) = dev.mr_reg(id, n as u32, REMOTE_RW)?;
    ensure!(mr != 0, "region handle 0");
    verify(
        "new region is zeroed",
        &vec![0; n],
        &dev.mr_read(id, mr, 0, n)?,
    )?;
    // The whole peer region, then a sub-range at odd offsets on both sides.
    dev.rdma(id, RDMA_CM_RS_RDMA_READ, mr, 0, plen, paddr, pkey)
        .context("RDMA READ of the peer's region")?;
    let peer = pattern(n, SEED_PEER_REGION);
    verify("RDMA READ", &peer, &dev.mr_read(id, mr, 0, n)?)?;
    dev.mr_write(id, mr, 0, &vec![0; n])?;
    dev.rdma(id, RDMA_CM_RS_RDMA_READ, mr, 100, 5000, paddr + 1000, pkey)?;
    let got = dev.mr_read(id, mr, 0, 5200)?;
    verify("RDMA READ at offsets", &peer[1000..6000], &got[100..5100])?;
    verify("bytes around the READ untouched", &[0; 100], &got[..100])?;
    verify("bytes after the READ untouched", &[0; 100], &got[5100..])?;
    // Module WRITE into the peer's region.
    let writes = pattern(n, SEED_MODULE_WRITES);
    dev.mr_write(id, mr, 0, &writes)?;
    dev.rdma(id, RDMA_CM_RS_RDMA_WRITE, mr, 0, plen, paddr, pkey)
        .context("RDMA WRITE into the peer's region")?;
    // Now the peer's turn on the module's region.
    let region = pattern(n, SEED_MODULE_REGION);
    dev.mr_write(id, mr, 0, &region)?;
    dev.send(id, &advert(maddr, mkey, n as u32))?;
    verify("peer: done", b"written", &dev.recv(id, 4096, T)?)?;
    verify(
        "peer's RDMA WRITE into the module's region",
        &pattern(n, SEED_PEER_WRITES),
        &dev.mr_read(id, mr, 0, n)?,
    )?;
    dev.mr_dereg(id, mr)?;
    expect_errno(
        "read a deregistered region",
        dev.mr_read(id, mr, 0, 1),
        libc::EINVAL,
    )?;
    expect_errno("deregister twice", dev.mr_dereg(id, mr), libc::EINVAL)?;
    // The peer answers "dereg" at once with its stale-key WRITE, which the
    // module's side NAKs, moving its QP to the error state: across a wire
    // that can come before this SEND's ACK was processed, and the SEND is
    // then flushed although it arrived (the peer's `stale` result below
    // proves it did).
    match dev.send(id, b"dereg") {
        Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => {}
        other => other.context("send \"dereg\"")?,
    }
    // The peer disconnects after its stale write.
    let d = wait(&dev, EventType::Disconnected)?;
    ensure!(d.id == id, "DISCONNECTED on id {}", d.id);
    dev.disconnect(id)?;
    let r = call.result()?;
    let hash = |v: &[u8]| format!("{:016x}", fnv64(v));
    ensure!(
        field(&r, "region")? == hash(&writes),
        "module's WRITE seen by the peer: {r:?}"
    );
    ensure!(field(&r, "read_status")? == "0", "peer's READ: {r:?}");
    ensure!(
        field(&r, "read")? == hash(&region),
        "peer's READ of the module's region: {r:?}"
    );
    ensure!(field(&r, "write_status")? == "0", "peer's WRITE: {r:?}");
    // IB answers a WRITE with a bad key with a NAK: the writer's completion
    // carries the remote access error.  An iWARP WRITE completes at the
    // writer once handed to TCP (RDMAP has no WRITE response): the target
    // finds the stale key and terminates the connection instead.
    let stale = if ctx.iwarp() { 0 } else { WC_REM_ACCESS_ERR };
    ensure!(
        field(&r, "stale")? == stale.to_string(),
        "a WRITE with a deregistered region's key: completion status {stale} expected: {r:?}"
    );
    Ok(())
}

/// What the module refuses before posting (EINVAL, ENOSPC, EFAULT,
/// ENOTCONN), then a READ with a wrong key: EACCES from the peer, after
/// which the QP is in error and flushes (ECANCELED).
pub(super) fn rdma_errors(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let unconnected = dev.create_id(0)?;
    expect_errno(
        "MR_REG without a connection",
        dev.mr_reg(unconnected, 4096, 0),
        libc::ENOTCONN,
    )?;
    let (call, id, (paddr, pkey, plen)) = connect_rdma_peer(ctx, &dev, 4096, "victim")?;
    let max = RDMA_CM_RS_MAX_MR_LEN;
    expect_errno("MR_REG of 0 bytes", dev.mr_reg(id, 0, 0), libc::EINVAL)?;
    expect_errno(
        "MR_REG over the limit",
        dev.mr_reg(id, max + 1, 0),
        libc::EINVAL,
    )?;
    expect_errno(
        "MR_REG unknown access bit",
        dev.mr_reg(id, 4096, 4),
        libc::EINVAL,
    )?;
    let mut regs = Vec::new();
    for i in 0..RDMA_CM_RS_MAX_MRS {
        let len = if i == 0 { max } else { 4096 };
        regs.push(
            dev.mr_reg(id, len, REMOTE_RW)
                .with_context(|| format!("region {i}"))?,
        );
    }
    expect_errno("one region too many", dev.mr_reg(id, 4096, 0), libc::ENOSPC)?;
    let keys: std::collections::BTreeSet<_> = regs.iter().map(|r| r.2).collect();
    ensure!(keys.len() == regs.len(), "remote keys repeat: {regs:?}");
    for r in &regs[2..] {
        dev.mr_dereg(id, r.0)?;
    }
    let (big, small) = (regs[0].0, regs[1].0);
    // The largest region works end to end.
    dev.mr_write(id, big, max - 4096, &pattern(4096, 7))?;
    verify(
        "last page of a 1 MiB region",
        &pattern(4096, 7),
        &dev.mr_read(id, big, max - 4096, 4096)?,
    )?;
    expect_errno(
        "MR_READ past the end",
        dev.mr_read(id, small, 4000, 97),
        libc::EINVAL,
    )?;
    expect_errno(
        "MR_READ of 0 bytes",
        dev.mr_read(id, small, 0, 0),
        libc::EINVAL,
    )?;
    expect_errno(
        "MR_READ unknown region",
        dev.mr_read(id, 99, 0, 1),
        libc::EINVAL,
    )?;
    let mut bad = rdma_cm_rs_mr_copy {
        id,
        mr: small,
        offset: 0,
        len: 16,
        buf: 8,
    };
    expect_errno(
        "MR_WRITE from a bad pointer",
        dev.raw_ioctl(IOC_MR_WRITE, &mut bad as *mut _ as usize),
        libc::EFAULT,
    )?;
    expect_errno(
        "MR_READ to a bad pointer",
        dev.raw_ioctl(IOC_MR_READ, &mut bad as *mut _ as usize),
        libc::EFAULT,
    )?;
    let rd = RDMA_CM_RS_RDMA_READ;
    expect_errno(
        "RDMA opcode 3",
        dev.rdma(id, 3, small, 0, 16, paddr, pkey),
        libc::EINVAL,
    )?;
    expect_errno(
        "RDMA of 0 bytes",
        dev.rdma(id, rd, small, 0, 0, paddr, pkey),
        libc::EINVAL,
    )?;
    expect_errno(
        "RDMA past the region",
        dev.rdma(id, rd, small, 4090, 7, paddr, pkey),
        libc::EINVAL,
    )?;
    expect_errno(
        "RDMA unknown region",
        dev.rdma(id, rd, 42, 0, 16, paddr, pkey),
        libc::EINVAL,
    )?;
    expect_errno(
        "RDMA remote address wraps",
        dev.rdma(id, rd, small, 0, 16, u64::MAX - 8, pkey),
        libc::EINVAL,
    )?;
    let mut reserved = rdma_cm_rs_rdma {
        id,
        opcode: rd,
        mr: small,
        len: 16,
        rkey: pkey,
        remote_addr: paddr,
        reserved: 1,
        ..Default::default()
    };
    expect_errno(
        "RDMA reserved field",
        dev.raw_ioctl(IOC_RDMA, &mut reserved as *mut _ as usize),
        libc::EINVAL,
    )?;
    // A good READ first, so that a failure below is the key's.
    dev.rdma(id, rd, small, 0, plen, paddr, pkey)?;
    verify(
        "READ",
        &pattern(4096, SEED_PEER_REGION),
        &dev.mr_read(id, small, 0, 4096)?,
    )?;
    // IB: the peer NAKs the key (EACCES), then the QP is in error and
    // flushes.  iWARP: the peer terminates the connection (RFC 5040) and
    // the READ, never answered, is flushed.
    let bad_key = if ctx.iwarp() {
        libc::ECANCELED
    } else {
        libc::EACCES
    };
    expect_errno(
        "READ with a wrong key",
        dev.rdma(id, rd, small, 0, 16, paddr, pkey ^ 0x5a00),
        bad_key,
    )?;
    let after = dev.rdma(id, rd, small, 0, 16, paddr, pkey);
    if ctx.iwarp() {
        // Flushed, or refused once the termination's DISCONNECTED is in.
        let e = errno_of(after);
        ensure!(
            matches!(e, Some(libc::ECANCELED | libc::ENOTCONN)),
            "READ after the termination: errno {e:?}, expected ECANCELED or ENOTCONN"
        );
    } else {
        expect_errno("READ on a QP in error", after, libc::ECANCELED)?;
    }
    // Deregistration still works (the invalidation is flushed).
    dev.mr_dereg(id, small)?;
    if ctx.iwarp() {
        // The termination ended the connection already.
        let d = wait(&dev, EventType::Disconnected)?;
        ensure!(d.id == id, "DISCONNECTED on id {}", d.id);
    } else {
        dev.disconnect(id)?;
        wait(&dev, EventType::Disconnected)?;
    }
    let r = call.result()?;
    ensure!(field(&r, "disc0")? == "DISCONNECTED", "peer: {r:?}");
    dev.destroy(unconnected)?;
    // `big` goes with the file.
    let _ = big;
    Ok(())
}
