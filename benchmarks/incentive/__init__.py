"""Incentive calibration: does the Gauntlet pay for work done? The Gauntlet on real updates
(`gauntlet_sim`), the subnet-scale simulator through Yuma (`subnet_sim` and its scenarios
`subnet_sim_*`), localnets with several validators (`localnet_consensus`), the honest distributions
behind the shared-work and borrowed-work checks (`similarity`, `borrowed_similarity`) and the sync
check under each outer rule (`desync_rules`)."""
