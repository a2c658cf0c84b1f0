"""The data layer, below every task and above the model ops, so detection, segmentation and
classification import one copy: image decoding and transforms, datasets with the bad-image
policy, splits, epoch order and demo data; and what each run builds on: the run card,
checkpoints, the frozen-prefix feed with its cache, and the guards."""
