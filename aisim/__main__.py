from aisim.app import main

main()
