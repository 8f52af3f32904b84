//! Block-device ioctls (BLKDISCARD, BLKGETSIZE64). Owned by the block-device work.
