-- core/records.lua -- stored records (serialization/stored.py) read in place, and the
-- deadline of a record persisted now. Owns: deadline_for, tmo_key, source_of, budget_of,
-- queue_fields_of, frame_len, with_payload. Invariant: readers take a record at a byte
-- offset of any string and copy nothing; a record is only ever copied whole (its lineage
-- id and checksum go with it), or with a new payload and that payload's checksum.
-- Deadline of a record persisted now: the end of the bucket B intervals ahead, so it
-- fails between (B-1)*I = T and B*I = T*B/(B-1) after it was persisted.
local function deadline_for(interval_ms, buckets)
  return (math.floor(NOW / interval_ms) + buckets) * interval_ms
end

local function tmo_key(deadline)
  return PREFIX .. ':t:' .. string.format('%d', deadline)
end

-- A stored record (serialization/stored.py): a STORED_HEAD-byte header (length, hash code,
-- partition, source index, replay budget, checksum, lineage id), then its payload. The
-- positions and formats of its fields (STORED_*) are constants of the prelude, generated
-- from Python's layout (ftlayer/wire.py). Scripts copy a stored record whole, so its
-- lineage id stays with it through every replay and re-drive.
-- The readers below take the stored record at byte ``off`` (0-based, default 0) of a
-- string, so a record inside a bucket's frames is read in place.
local function source_of(frame, off)
  return (sunpack(STORED_U16, frame, (off or 0) + STORED_SOURCE_AT))
end

-- The record's replay budget, written into its frame by the pipeline that persisted it;
-- an override >= 0 (a sidecar's --max-replays) replaces it.
local function budget_of(frame, override, off)
  if override >= 0 then return override end
  return (sunpack(STORED_U16, frame, (off or 0) + STORED_BUDGET_AT))
end

-- Its hash code, original partition and source index: what its replay queue entry
-- carries, and which queue.
local function queue_fields_of(frame, off)
  local hc, part, source = sunpack(STORED_QUEUE_FIELDS, frame, (off or 0) + STORED_QUEUE_AT)
  return hc, part, source
end

-- The stored record ``frame`` with the payload ``payload`` (``sum``: its checksum, from
-- the caller) in place of its own: its hash code, partition, source, budget and lineage
-- id kept (a replay read back from its source that failed again, now kept as the input
-- of the stage it failed in).
local function with_payload(frame, payload, sum)
  return spack(STORED_LEN, #payload) .. ssub(frame, 5, STORED_CHECKSUM_AT - 1)
    .. spack(STORED_LEN, sum) -- (a u32, as the length)
    .. ssub(frame, STORED_CHECKSUM_AT + 4, STORED_HEAD) .. payload
end

local function frame_len(frames, off)
  return STORED_HEAD + (sunpack(STORED_LEN, frames, off + 1))
end
