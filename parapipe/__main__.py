from parapipe.cli import main

main()
